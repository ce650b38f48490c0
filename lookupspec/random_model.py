"""A model of another model's exact shape and tokenizer, with random weights.

Timings and kernel checks need a model of the real shape, not its weights: a lent GPU machine cannot
take SmolLM2's checkpoint (the device tool carries 64 MiB), and a Llama-1B-shaped step costs the
same whatever the weights. :func:`build_random_model` reads the source's ``config.json`` (a named
model, a Hugging Face directory, with or without weights, or a bare ``config.json``), draws every
weight with transformers' own initialisation from ``seed`` (normal with the config's
``initializer_range``, or the one given), and writes a directory every lookupspec command loads:
``config.json``, ``model.safetensors``, the source's tokenizer and generation files, and a
``lookupspec.json`` that says the weights are random. Nothing is downloaded.

The initializer range matters for what the model does. SmolLM2's own (0.02) gives nearly flat
logits: on random input ids a median top logit of 2.0 and a median gap of 0.067 to the runner-up,
a few bfloat16 steps, so rounding decides many greedy tokens. 0.25, as the tiny test models use,
gives a median top logit of 25 and a gap of 0.83 (both measured on SmolLM2's shape, 4 x 32 random
ids, float32 forward); the GPU figures in docs/gpu.md use it.

Example: ``build_random_model("smollm2-135m-instruct", Path("/tmp/rand"), initializer_range=0.25,
dtype="bfloat16")`` writes a 270 MB bfloat16 model of SmolLM2-135M's shape with its tokenizer.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from lookupspec.models import ModelLoadError, model_dir_written, resolve_model_path

__all__ = ["TOKENIZER_FILES", "build_random_model"]

# What a model directory holds besides its config and weights, copied as they are.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
                   "generation_config.json")

_DTYPES = ("float32", "bfloat16", "float16")


def _config_dir(source: str) -> tuple[Path, Path | None]:
    """(the file holding the config, the directory whose tokenizer files come along (None: none))."""
    path = Path(source).expanduser()
    if path.is_file() and path.suffix.lower() == ".json":
        return path, None
    directory = resolve_model_path(source)
    return directory / "config.json", directory


def build_random_model(source: str, out: Path, *, seed: int = 0, initializer_range: float | None = None,
                       dtype: str = "float32", tokenizer: str | Path | None = None, force: bool = False,
                       log: Callable[[str], None] = print) -> Path:
    """Write a random-weight model of ``source``'s shape into ``out`` (see the module docstring).

    ``tokenizer``: a directory whose tokenizer files to copy instead of the source's (a bare
    ``config.json`` has none). ``out`` must not exist, or be empty, unless ``force``. Raises
    :class:`~lookupspec.models.ModelLoadError` for a bad source, tokenizer or output path."""
    if dtype not in _DTYPES:
        raise ModelLoadError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    if initializer_range is not None and not initializer_range > 0:
        raise ModelLoadError(f"initializer_range must be > 0, got {initializer_range}")
    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise ModelLoadError(f"{out} exists and is not an empty directory (pass --force to replace it)")
    config_file, files_from = _config_dir(source)
    if tokenizer is not None:
        files_from = Path(tokenizer).expanduser()
        if not files_from.is_dir():
            raise ModelLoadError(f"tokenizer directory {files_from} does not exist")
    copied = [f for f in TOKENIZER_FILES if files_from is not None and (files_from / f).is_file()]
    if files_from is not None and not any(f.startswith("tokenizer") for f in copied):
        raise ModelLoadError(f"{files_from} has no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...): "
                             f"pass --tokenizer DIR, or its config.json alone for a model without one")

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(config_file), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot read a model config from {config_file}: {exc}") from exc
    if initializer_range is not None:
        config.initializer_range = initializer_range
    log(f"drawing {type(config).__name__} weights (seed {seed}, initializer range "
        f"{getattr(config, 'initializer_range', 'default')}, {dtype}) ...")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    with model_dir_written(out) as tmp:
        model.save_pretrained(str(tmp))
        for name in copied:
            assert files_from is not None
            shutil.copyfile(files_from / name, tmp / name)
        note = {"name": out.name, "random_weights": True, "shape_of": str(source), "seed": seed,
                "initializer_range": getattr(config, "initializer_range", None), "dtype": dtype,
                "tokenizer_from": str(files_from) if files_from is not None else None}
        (tmp / "lookupspec.json").write_text(json.dumps(note, indent=2) + "\n")
    params = sum(p.numel() for p in model.parameters())
    log(f"saved {out} ({params / 1e6:.1f}M parameters{'' if copied else ', no tokenizer'})")
    return out
