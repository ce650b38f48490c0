"""Native float32 attention for ragged batches on x86 CPUs, built from ``attention.c`` on first use.

``scaled_dot_product_attention`` runs once per sequence and layer (240 calls for an 8-sequence step
of SmolLM2-135M), each with its own dispatch, slicing and output copy, so attention cost would grow
with the batch far faster than its arithmetic. ``attention.c`` takes one layer's whole batch in one
call (decode rows, draft trees and prompt chunks, each view over its own slot of the pool and with
its own mask) and splits the work over torch's OpenMP
threads.

Each row's arithmetic is fixed by its own position: the dot products, the softmax and the weighted
sum of values run in one order over the row's visible keys, counted from its first visible position
(see the C source). So a row gets the same bits whether it comes in a prompt chunk of any size, a
draft tree or a one-token step, alone or in a batch: the forward stays batch-invariant, and becomes
chunk-invariant as far as attention goes. The results differ from SDPA's in the last bits (float32
in another order), as two BLAS libraries differ.

It covers float32 queries and pools on the CPU with head sizes that are multiples of 16, soft-capped
scores (Gemma 2) included, and no sinks; anything else keeps SDPA (or, for sinks, the attention
written out). ``LOOKUPSPEC_CPU_ATTENTION``: ``auto`` (default:
the kernel where it builds), ``native`` (a failed build is an error) or ``sdpa``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from .loader import LazyLibrary

if TYPE_CHECKING:
    from ..ragged import RaggedBatch

__all__ = ["NativePlan", "applies", "attend_native", "kernel", "kernel_error"]

_SOURCE = Path(__file__).with_name("attention.c")
_PLAN = 7  # per view: slot, r0, r1, lo, hi, kind, mask offset (attention.c's PLAN)


def _declare(lib: ctypes.CDLL) -> None:
    p, i64 = ctypes.c_void_p, ctypes.c_long
    lib.attention_ragged.argtypes = [p, i64, i64, p, i64, i64, i64, p, i64, i64, i64, i64, i64, i64, i64,
                                     p, i64, p, ctypes.c_float, ctypes.c_float, p, ctypes.c_int]
    lib.attention_ragged.restype = None
    lib.attention_isa.restype = ctypes.c_int


_LIBRARY = LazyLibrary(_SOURCE, _declare, "LOOKUPSPEC_CPU_ATTENTION", on="native", off="sdpa",
                       fallback="attention uses SDPA")


def kernel() -> ctypes.CDLL | None:
    """The built library, or None where it cannot be built (or ``LOOKUPSPEC_CPU_ATTENTION=sdpa``);
    :func:`kernel_error` says why. Raises with ``LOOKUPSPEC_CPU_ATTENTION=native`` when the build
    fails."""
    return _LIBRARY.get()


def kernel_error() -> str | None:
    """Why :func:`kernel` returned None (None when it did not, or was not asked)."""
    return _LIBRARY.error


def applies(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether ``attention.c`` covers a layer: float32 on the CPU, head sizes multiples of 16, query
    heads a multiple of key/value heads, each head's floats contiguous."""
    return (query.device.type == "cpu" and keys.device.type == "cpu"
            and query.dtype == keys.dtype == values.dtype == torch.float32
            and query.shape[-1] % 16 == 0 and values.shape[-1] % 16 == 0
            and query.shape[-1] == keys.shape[-1] and query.shape[1] % keys.shape[1] == 0
            and keys.stride(-1) == 1 and values.stride(-1) == 1)


@dataclass
class NativePlan:
    """One pool group's attention plan for a batch: ``plan`` [views, 7] int64 (host memory, read
    by the kernel only) and every view's explicit mask, flattened into ``masks`` (uint8)."""

    plan: np.ndarray
    masks: torch.Tensor

    @classmethod
    def of(cls, batch: RaggedBatch, group: int) -> NativePlan:
        from ..ragged import CAUSAL

        rows, parts, offset = [], [], 0
        for view in batch.views:
            lo, hi = view.key_range[group]
            mask = view.masks[group]
            if mask is None:
                kind, at = 0, 0
            elif isinstance(mask, str):
                if mask != CAUSAL:
                    raise ValueError(f"unknown mask marker {mask!r}")
                kind, at = 1, 0
            else:
                flat = mask.reshape(-1).contiguous().view(torch.uint8)
                if flat.numel() != view.rows * (hi - lo):
                    raise ValueError(f"a mask of {tuple(mask.shape)} for {view.rows} rows over "
                                     f"{hi - lo} keys")
                kind, at = 2, offset
                parts.append(flat)
                offset += flat.numel()
            rows.append([view.slot, view.r0, view.r1, lo, hi, kind, at])
        pool = batch.pool.keys(0)
        masks = torch.cat(parts) if parts else pool.new_zeros(1, dtype=torch.uint8)
        return cls(np.asarray(rows, dtype=np.int64).reshape(-1, _PLAN), masks)


def attend_native(lib: ctypes.CDLL, batch: RaggedBatch, group: int, query: torch.Tensor, keys: torch.Tensor,
                  values: torch.Tensor, scaling: float | None, softcap: float | None = None) -> torch.Tensor:
    """One layer's attention for ``batch`` through ``attention.c``. query ``[1, heads, rows, d]`` (the
    rows' keys and values already in the pool); keys/values: the layer's pool tensors ``[slots,
    kv_heads, entries, d | dv]``; ``softcap``: soft-capped scores (Gemma 2), None for none. Returns
    ``[1, rows, heads, dv]`` (pad rows zero)."""
    plan = batch.native_plans.get(group)
    if plan is None:
        plan = batch.native_plans[group] = NativePlan.of(batch, group)
    q = query[0]  # [heads, rows, d]
    if q.stride(-1) != 1:
        q = q.contiguous()
    heads, d, dv = q.shape[0], q.shape[-1], values.shape[-1]
    out = query.new_empty((batch.rows, heads, dv))
    if batch.pad:
        out[batch.real_rows:] = 0
    scale = float(scaling) if scaling is not None else d ** -0.5
    lib.attention_ragged(q.data_ptr(), q.stride(1), q.stride(0),
                   keys.data_ptr(), keys.stride(0), keys.stride(1), keys.stride(2),
                   values.data_ptr(), values.stride(0), values.stride(1), values.stride(2),
                   heads, keys.shape[1], d, dv, plan.plan.ctypes.data, plan.plan.shape[0],
                   plan.masks.data_ptr(), scale, float(softcap) if softcap else 0.0, out.data_ptr(),
                   torch.get_num_threads())
    return out.view(1, batch.rows, heads, dv)
