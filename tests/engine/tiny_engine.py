"""Helpers shared by the engine tests that compare a path's tokens with plain decoding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lookupspec.params import GenerationParams, SpecParams
from lookupspec.runtime import pack_linears, packing_available


def packed_model(tiny_models: dict[str, Any], name: str) -> Any:
    """The tiny model ``name``, loaded, its linear layers packed where the kernel allows (as served)."""
    from lookupspec.models import load_model

    model = load_model(str(tiny_models[name])).model
    if packing_available():
        pack_linears(model)
    return model


def plain_tokens(engine: Any,
                 requests: Sequence[tuple[list[int], GenerationParams]]) -> dict[tuple, list[int]]:
    """Each request's tokens from ``engine`` with speculation off, one request at a time."""
    off = SpecParams(enabled=False)
    return {tuple(p): [t for s in engine.generate(p, params, spec=off) for t in s.tokens]
            for p, params in requests}
