"""A model's linear layers served from its GGUF file's quantized tensors.

transformers loads a GGUF checkpoint by dequantizing every tensor with ``gguf.quants`` (and, for
Llama-family query and key projections, reordering their rows back into Hugging Face's rotary
layout). :func:`quantize_linears` takes such a model and its GGUF file and replaces each
``nn.Linear`` whose tensor is quantized (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) by a
:class:`~.cpu_linear.QuantizedLinear` over the tensor's own bytes, once a check shows that the
kernel's dequantization equals the float weight bit for bit (in the file's row order or in the
rotary reordering). A layer that fails the check keeps its float weight. F16, BF16 and F32
tensors, norms and embeddings stay as transformers loaded them.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .cpu_linear import QuantizedLinear
from .native.quantized import QUANT_TYPES, QuantWeights

__all__ = ["quantize_linears", "resident_bytes"]


def _rotary_rows(rows: int, heads: int) -> np.ndarray | None:
    """The row order transformers gives a Llama query/key projection of ``heads`` heads: HF row
    ``t`` is GGUF row ``order[t]`` (GGUF interleaves each head's two rotary halves)."""
    if heads <= 0 or rows % (2 * heads):
        return None
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(-1)


def _architecture(reader: Any) -> Any:
    import gguf

    field = reader.fields["general.architecture"]
    name = bytes(field.parts[field.data[0]]).decode()
    for arch, arch_name in gguf.MODEL_ARCH_NAMES.items():
        if arch_name == name:
            return arch
    raise KeyError(name)


def quantize_linears(model: Any, gguf_path: Path, lib: ctypes.CDLL,
                     log: Callable[[str], None] = print) -> Counter[str]:
    """Replace ``model``'s linear layers by quantized ones from ``gguf_path`` (in place); returns how
    many of each GGUF type were replaced. ``lib``: the built matmul kernel."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    tensors = {t.name: t for t in reader.tensors}
    cfg = model.config.get_text_config(decoder=True)
    try:
        names = gguf.get_tensor_name_map(_architecture(reader), int(cfg.num_hidden_layers))
    except (KeyError, AttributeError):
        log(f"{gguf_path.name}: an architecture gguf has no tensor names for; the weights stay float")
        return Counter()
    heads = {int(getattr(cfg, "num_attention_heads", 0) or 0),
             int(getattr(cfg, "num_key_value_heads", 0) or 0)}
    done: Counter[str] = Counter()
    kept: list[str] = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or child.weight.dtype != torch.float32:
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            gname = names.get_name(name)
            tensor = tensors.get(f"{gname}.weight") if gname else None
            if tensor is None and child_name == "lm_head":
                tensor = tensors.get("token_embd.weight")  # tied to the embedding
            if tensor is None or tensor.tensor_type.name not in QUANT_TYPES:
                continue
            kind = tensor.tensor_type.name
            raw = np.asarray(tensor.data, dtype=np.uint8).reshape(child.out_features, -1)
            want = child.weight.detach()
            rotary = (_rotary_rows(child.out_features, h) for h in sorted(heads))
            for order in [None, *(o for o in rotary if o is not None)]:
                rows = raw if order is None else raw[order]
                weights = QuantWeights.from_gguf(lib, kind, rows, child.in_features, child.bias)
                if torch.equal(weights.dense(), want):
                    setattr(parent, child_name, QuantizedLinear(weights))
                    done[kind] += 1
                    break
            else:
                kept.append(name)
    if kept:
        log(f"{len(kept)} linear layers keep their float weights: their GGUF tensors do not dequantize "
            f"to what transformers loaded ({', '.join(kept[:3])}{', ...' if len(kept) > 3 else ''})")
    return done


def resident_bytes(model: Any) -> int:
    """Bytes of the model's weights in memory: parameters and buffers (each tensor once, tied ones
    too) and the quantized layers' planes."""
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    for m in model.modules():
        if isinstance(m, QuantizedLinear) and id(m.weights) not in seen:
            seen.add(id(m.weights))
            total += m.weights.nbytes
    return total
