"""The row table through which one compaction launch reaches every tensor of a KV slot pool.

A pool keeps its keys and values in a few tensors ``[rows, slots, kv_heads, capacity, dim]`` (one per
group of layers that share a shape and a sliding window; keys and values of a layer are two of its
rows). They are separate allocations that grow independently: a full-attention group doubles its
capacity while a sliding group stays at its window. A single tensor for all of them would make every
growth copy every group. Instead :func:`pool_table` describes each row of each tensor by its address
and strides, and ``compact_pool`` launches once over all rows.

Columns (int64): the row's address in bytes, its slot / head / position strides in elements, its kv
heads and head size, its group (the column of the per-group base entry), and padding to a power of two.
Example: a pool with one group of 2 layers whose keys and values share a tensor [4, S, H, C, D] has a
table of 4 rows, row ``r`` at ``data_ptr + r * S * H * C * D * itemsize``.

The addresses are valid until the pool reallocates (``SlotPool.generation`` changes): build the
table, launch, and rebuild after any growth.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["COLS", "pool_table"]

COL_ADDR, COL_STRIDE_SLOT, COL_STRIDE_HEAD, COL_STRIDE_POS, COL_HEADS, COL_DIM, COL_GROUP = range(7)
COLS = 8


def pool_table(tensors: Sequence[torch.Tensor], tensor_groups: Sequence[int]) -> np.ndarray:
    """[rows of all tensors, COLS] int64 host table (see the module docstring)."""
    out = []
    for t, g in zip(tensors, tensor_groups, strict=True):
        if t.dim() != 5 or t.stride(4) != 1:
            raise ValueError(f"pool tensors must be [rows, slots, heads, capacity, dim] with unit stride on "
                             f"dim, got {tuple(t.shape)} strides {t.stride()}")
        for r in range(t.shape[0]):
            out.append([t.data_ptr() + r * t.stride(0) * t.element_size(), t.stride(1), t.stride(2),
                        t.stride(3), t.shape[2], t.shape[4], g, 0])
    return np.asarray(out, dtype=np.int64).reshape(-1, COLS)
