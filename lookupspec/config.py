"""Configuration of the model and of the engine: small frozen dataclasses, validated on construction.

Each layer receives its own object and nothing else: :func:`lookupspec.text.TextEngine.load` a
:class:`ModelConfig` (how the weights are loaded and prepared) and an :class:`EngineConfig` (what the
engine holds and how it runs steps), which it hands to :class:`lookupspec.engine.Engine`. The core
reads no environment variable for these: front ends build the objects from their flags and
environment (the CLI's adapter is :mod:`lookupspec.commands.common`).

Example::

    TextEngine.load("smollm2-135m-instruct", ModelConfig(dtype="float32"),
                    EngineConfig(max_batch=8, prefill_chunk=128, prefix_cache_bytes=64 << 20))
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CUDA_GRAPHS", "DTYPES", "WEIGHTS", "EngineConfig", "ModelConfig"]

DTYPES = ("auto", "float32", "bfloat16", "float16")  # "auto": bfloat16 on CUDA, float32 on the CPU
WEIGHTS = ("auto", "quantized", "float32")  # "auto": quantized where a GGUF file and the kernel allow
# "auto": on for CUDA devices, off elsewhere; "on" on the CPU runs the static step eagerly (tests)
CUDA_GRAPHS = ("auto", "on", "off")


@dataclass(frozen=True)
class ModelConfig:
    """How a target (and its draft model) is loaded and prepared.

    ``draft_model``: a model spec sharing the target's tokenizer, or ``self:layers=K`` /
    ``self:int8`` derived from the target (None: no draft model). ``dtype``: weights and compute
    (``auto``: bfloat16 on CUDA, float32 on the CPU). ``device``: ``cpu`` or ``cuda[:N]``.
    ``auto_pull``: fetch a named default model into the cache when it is missing.
    ``packed_linear``: on CPU in float32, run the linear layers on prepacked weights
    (:mod:`lookupspec.runtime.cpu_linear`; same arithmetic up to summation order, faster).
    ``weights``: how a GGUF model's linear layers are held, ``quantized``, ``float32`` or ``auto``
    (None: :func:`lookupspec.models.weights_choice` decides)."""

    draft_model: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    auto_pull: bool = False
    packed_linear: bool = True
    weights: str | None = None

    def __post_init__(self) -> None:
        if self.weights is not None and self.weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {self.weights!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not self.device:
            raise ValueError("device must name a torch device (cpu, cuda[:N]), got ''")
        if self.draft_model is not None and not self.draft_model:
            raise ValueError("draft_model must be a model spec or None, got ''")


@dataclass(frozen=True)
class EngineConfig:
    """What an :class:`~lookupspec.engine.Engine` holds and how it runs its forwards.

    ``context_window``: positions a sequence may reach (None: the model's). ``lean``: decode and
    verify through the lean forward where the model allows it (:mod:`lookupspec.runtime.lean`; the
    same output, faster). ``max_batch``: sequences in flight at once (KV slots).
    ``kv_cache_bytes``: the KV pool's budget, reserved at once (None: it grows as needed).
    ``prefill_chunk``: prompt tokens per prefill forward (None: a whole prompt at once).
    ``prefix_cache_bytes``: the prefix cache's budget (0: none; it needs ``prefill_chunk``).
    ``prefix_block_size``: its block in tokens (None: the engine's choice, see
    :meth:`lookupspec.engine.Engine._prefix_block_size`). ``cuda_graphs``: whether forwards go
    through the static-shape step, replayed as CUDA graphs (``auto``: on CUDA devices; ``on`` on the
    CPU runs it eagerly; :mod:`lookupspec.runtime.static.serving`)."""

    context_window: int | None = None
    lean: bool = True
    max_batch: int = 64
    kv_cache_bytes: int | None = None
    prefill_chunk: int | None = None
    prefix_cache_bytes: int = 0
    prefix_block_size: int | None = None
    cuda_graphs: str = "auto"

    def __post_init__(self) -> None:
        if self.cuda_graphs not in CUDA_GRAPHS:
            raise ValueError(f"cuda_graphs must be one of {', '.join(CUDA_GRAPHS)}, got {self.cuda_graphs!r}")
        if self.context_window is not None and self.context_window < 2:
            raise ValueError(f"context_window must be >= 2, got {self.context_window}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 1:
            raise ValueError(f"kv_cache_bytes must be >= 1 or None, got {self.kv_cache_bytes}")
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if self.prefix_cache_bytes < 0:
            raise ValueError(f"prefix_cache_bytes must be >= 0, got {self.prefix_cache_bytes}")
        if self.prefix_cache_bytes > 0 and self.prefill_chunk is None:
            raise ValueError("the prefix cache keeps blocks of chunked prefills: it needs prefill_chunk")
        block = self.prefix_block_size
        chunk = self.prefill_chunk
        if block is not None and (block < 1 or (chunk is not None and block > chunk)):
            raise ValueError(f"prefix_block_size must be between 1 and prefill_chunk ({chunk}), got {block}")
