"""Executing the model: everything between the engine's token ids and the target's logits.

- ``runner.py``: :class:`ModelRunner`, the seam the engine calls (``prefill`` in chunks, ``forward``
  over a ragged batch), its self-check and batch-invariance probe; :func:`prepare_models` (load-time
  packing of the linear layers).
- ``ragged.py``: :class:`SeqRows` (one sequence's rows in a forward) and :class:`RaggedBatch` (the
  flattened inputs and per-sequence masks, sliding windows included).
- ``attention.py``: the runtime's attention (per sequence, over its slot), registered with
  transformers so that any architecture's own forward can run a ragged batch; ``native/attention``:
  one native call per layer for the whole batch on CPU float32 (SDPA elsewhere).
- ``kvpool.py``: :class:`SlotPool`, the KV cache of many sequences (allocate, free, truncate,
  compact, copy a prefix).
- ``lean.py``: :class:`LeanForward`, the low-overhead forward for Llama-shaped CPU float32 models.
- ``cpu_linear.py``: prepacked float32 linear layers and their fusion; ``native/matmul``: the
  streaming matmul they use where it builds (oneDNN elsewhere).
- ``native/``: the C kernels (matmul, attention, the lean forward's element-wise steps), their
  shared SIMD header, and the loader that compiles them on first use.
- ``kvcache.py``: a per-request transformers ``Cache`` with preallocated buffers (draft models).
- ``static/``: the static-shape step (row buckets, one upload, CUDA graphs), which serves the runner's
  forwards where ``cuda_graphs`` asks (``auto``: on CUDA devices; ``static/serving.py``).
"""

from .attention import ATTN_NAME, active_batch, attend, use_runtime_attention
from .cpu_linear import FusedLinears, PackedLinear, pack_linears, packing_available
from .kvcache import KVCache
from .kvpool import LayerSpec, PoolFull, SlotPool
from .lean import LeanForward
from .ragged import RaggedBatch, SeqRows
from .runner import ModelRunner, RuntimeUnsupported, layer_specs, prepare_models

__all__ = [
    "ATTN_NAME",
    "FusedLinears",
    "KVCache",
    "LayerSpec",
    "LeanForward",
    "ModelRunner",
    "PackedLinear",
    "PoolFull",
    "RaggedBatch",
    "RuntimeUnsupported",
    "SeqRows",
    "SlotPool",
    "active_batch",
    "attend",
    "layer_specs",
    "pack_linears",
    "packing_available",
    "prepare_models",
    "use_runtime_attention",
]
