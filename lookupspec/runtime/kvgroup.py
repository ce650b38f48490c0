"""One group of the KV slot pool: the layers that share a cache shape and window, stored together
(the layout is in :mod:`lookupspec.runtime.kvpool`'s docstring). :class:`LayerSpec` says what one
layer caches; :class:`LayerGroup` allocates, copies and moves a group's entries, and keeps each slot's
``start``. The pool decides when a group grows and what it keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["ALIGN", "LayerGroup", "LayerSpec", "round_up"]

ALIGN = 64  # capacities are multiples of this many entries


@dataclass(frozen=True)
class LayerSpec:
    """What one attention layer caches: ``kv_heads`` heads of ``head_dim`` (keys) and ``value_dim``
    (values) floats per position; ``window`` is the sliding window ``W`` or None (full attention)."""

    kv_heads: int
    head_dim: int
    value_dim: int
    window: int | None = None

    def __post_init__(self) -> None:
        if min(self.kv_heads, self.head_dim, self.value_dim) < 1:
            raise ValueError(f"kv_heads, head_dim and value_dim must be >= 1: {self}")
        if self.window is not None and self.window < 2:
            raise ValueError(f"a sliding window must be >= 2, got {self.window}")


def round_up(n: int, align: int = ALIGN) -> int:
    return max(align, -(-int(n) // align) * align)


class LayerGroup:
    """Layers that share a cache shape and window: their storage, capacity and per-slot start."""

    def __init__(self, spec: LayerSpec, layers: list[int], slots: int, capacity: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.spec = spec
        self.layers = layers
        self.index = {layer: i for i, layer in enumerate(layers)}
        self.capacity = capacity
        self.start = np.zeros(slots, dtype=np.int64)
        self.dtype, self.device = dtype, device
        self.tensors = self._alloc(slots, capacity)

    @property
    def window(self) -> int | None:
        return self.spec.window

    def _alloc(self, slots: int, capacity: int) -> list[torch.Tensor]:
        s, n = self.spec, len(self.layers)
        if s.head_dim == s.value_dim:
            shapes = [(2 * n, slots, s.kv_heads, capacity, s.head_dim)]
        else:
            shapes = [(n, slots, s.kv_heads, capacity, s.head_dim),
                      (n, slots, s.kv_heads, capacity, s.value_dim)]
        return [torch.zeros(shape, dtype=self.dtype, device=self.device) for shape in shapes]

    def bytes_for(self, slots: int, capacity: int) -> int:
        s, n = self.spec, len(self.layers)
        per_entry = s.kv_heads * (s.head_dim + s.value_dim) * torch.finfo(self.dtype).bits // 8
        return n * slots * capacity * per_entry

    def keys(self, layer: int) -> torch.Tensor:
        return self.tensors[0][self.index[layer]]

    def values(self, layer: int) -> torch.Tensor:
        i = self.index[layer]
        return self.tensors[0][len(self.layers) + i] if len(self.tensors) == 1 else self.tensors[1][i]

    def resize(self, slots: int, capacity: int) -> None:
        """Reallocate to ``slots`` x ``capacity`` (never smaller), keeping every entry."""
        old = self.tensors
        old_slots, old_cap = old[0].shape[1], old[0].shape[3]
        self.tensors = self._alloc(slots, capacity)
        for new, prev in zip(self.tensors, old, strict=True):
            new[:, :old_slots, :, :old_cap].copy_(prev)
        self.capacity = capacity
        if slots > len(self.start):
            self.start = np.concatenate([self.start, np.zeros(slots - len(self.start), np.int64)])

    def move(self, slot: int, src: int, dst: int, count: int, to_slot: int | None = None) -> None:
        """Copy ``count`` entries of ``slot`` from entry ``src`` to entry ``dst`` (of ``to_slot``)."""
        if count <= 0:
            return
        target = slot if to_slot is None else to_slot
        for t in self.tensors:
            piece = t[:, slot, :, src:src + count]
            if target == slot and src < dst + count and dst < src + count:
                piece = piece.clone()  # overlapping ranges of one slot
            t[:, target, :, dst:dst + count].copy_(piece)
