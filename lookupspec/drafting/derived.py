"""Cheap draft models derived from the target, for deployments without a separate small model.

Two kinds, selected with a ``--draft-model`` spec:

- ``self:layers=K`` — the target's first ``K`` decoder layers followed by its own final norm and LM
  head (early exit). Shares every weight with the target: no extra memory, cost ~``K / L`` of a
  target forward plus the LM head.
- ``self:int8`` — a copy of the target with every ``nn.Linear`` dynamically quantized to int8
  (``torch.ao.quantization.quantize_dynamic``; CPU only). Close to the target's distribution, so
  acceptance is high, but the copy costs memory and int8 GEMMs are not always faster than fp32 ones.

Which one pays depends on the machine; ``lookupspec bench --draft-model`` measures it, and the
engine's cost model switches a draft model off by itself when its acceptance does not pay for its
cost. (docs/benchmarks.md, "Draft models", has what they measure for SmolLM2 on a CPU.)
"""

from __future__ import annotations

import copy
import re
from typing import Any

import torch

__all__ = ["DERIVED_PREFIX", "derive_draft", "is_derived_spec"]

DERIVED_PREFIX = "self:"


def is_derived_spec(spec: str) -> bool:
    return spec.startswith(DERIVED_PREFIX)


def _truncated(model: Any, k: int) -> Any:
    """A view of ``model`` with only its first ``k`` decoder layers (weights shared, not copied)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if inner is None or layers is None:
        raise ValueError("self:layers=K needs a decoder with a .model.layers list (llama/qwen2-style)")
    total = len(layers)
    if not 1 <= k < total:
        raise ValueError(f"self:layers=K needs 1 <= K < {total} (the target has {total} layers)")
    # nn.Module keeps children in __dict__['_modules']: copy those dicts so that swapping the layer
    # list on the draft leaves the target untouched.
    draft = copy.copy(model)
    draft._modules = dict(model._modules)
    draft_inner = copy.copy(inner)
    draft_inner._modules = dict(inner._modules)
    draft_inner.layers = torch.nn.ModuleList(list(layers)[:k])
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = k
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[:k]
    draft_inner.config = config
    draft.config = config
    draft.model = draft_inner
    return draft


def _int8(model: Any) -> Any:
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("self:int8 (dynamic int8 quantization) runs on the CPU only")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization announces its own deprecation
        q = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
    q.eval()
    return q


def derive_draft(model: Any, spec: str) -> Any:
    """Build the draft model a ``self:...`` spec names from the target ``model``."""
    body = spec[len(DERIVED_PREFIX):]
    m = re.fullmatch(r"layers=(\d+)", body)
    if m:
        return _truncated(model, int(m.group(1)))
    if body == "int8":
        return _int8(model)
    raise ValueError(f"unknown derived draft {spec!r}: use self:layers=K or self:int8")
