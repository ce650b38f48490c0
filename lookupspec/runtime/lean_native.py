"""The lean forward's element-wise steps as native calls, built from ``lean.c`` on first use.

Per layer the lean forward (:mod:`lookupspec.runtime.lean`) ran about a dozen small torch ops around
attention: the rotary embedding (two products, ``rotate_half``'s negation and concatenation, a sum),
the two indexed copies of the rows' keys and values into the KV pool, and RMSNorm's ``rsqrt`` and two
products, twice. Each op is a dispatch, an allocation and a pass over memory: ~45 us for the rotary
embedding and the copies of an 8-row step on a 2-core EPYC, ~1.5 ms of a 35 ms step over 30 layers.
Here they are one call each, with the same arithmetic: every product and sum rounded on its own
as torch rounds it (the C is built with ``-ffp-contract=off``), so the logits and KV entries stay
bit-identical to the torch ops (``tests/runtime/test_lean.py`` compares them with transformers'
forward).

``LOOKUPSPEC_LEAN_NATIVE``: ``auto`` (default: the library where it builds), ``native`` (a failed
build is an error) or ``torch`` (the torch ops).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .native_build import LazyLibrary

__all__ = ["kernel", "rms_norm", "rope_store"]

_SOURCE = Path(__file__).with_name("lean.c")


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, f32, i32 = ctypes.c_void_p, ctypes.c_long, ctypes.c_float, ctypes.c_int
    lib.lsl_rope_store.argtypes = [p, i64, i64, i64, i64, i64, i64, i64, p, p, i64, p,
                                   p, i64, i64, i64, p, i64, i64, i64, p, p, i64, i32]
    lib.lsl_rope_store.restype = None
    lib.lsl_rms_scale.argtypes = [p, i64, p, p, f32, p, i64, i64, i32]
    lib.lsl_rms_scale.restype = None


_LIBRARY = LazyLibrary(_SOURCE, _declare, "LOOKUPSPEC_LEAN_NATIVE", on="native", off="torch",
                       fallback="the lean forward uses torch ops")


def kernel() -> ctypes.CDLL | None:
    """The built library, or None where it cannot be built (or ``LOOKUPSPEC_LEAN_NATIVE=torch``)."""
    return _LIBRARY.get()


def rms_norm(lib: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm of float32 ``x`` [.., dim]: the mean of squares by torch, the
    rest in one call."""
    x = x.contiguous()
    variance = x.pow(2).mean(-1, keepdim=True)
    out = torch.empty_like(x)
    rows, dim = x.numel() // x.shape[-1], x.shape[-1]
    lib.lsl_rms_scale(x.data_ptr(), dim, variance.data_ptr(), weight.data_ptr(), eps, out.data_ptr(),
                      rows, dim, torch.get_num_threads())
    return out


def rope_store(lib: ctypes.CDLL, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int,
               kv_heads: int, keys: torch.Tensor, values: torch.Tensor, slot: torch.Tensor,
               entry: torch.Tensor, real: int) -> torch.Tensor:
    """The rotary embedding of a forward's queries and keys, and its rows' keys and values into the
    pool. ``qkv`` [rows, heads + 2 * kv_heads, d] (d contiguous); ``cos``/``sin`` [rows, d];
    ``keys``/``values``: the layer's pool tensors [slots, kv_heads, entries, d]; rows ``< real`` go
    to ``(slot[r], entry[r])`` (int64). Returns the rotated queries as ``[1, heads, rows, d]`` (a
    view of a [rows, heads, d] tensor)."""
    rows, _, d = qkv.shape
    if cos.stride(-1) != 1 or cos.stride() != sin.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    slot, entry = slot.contiguous(), entry.contiguous()
    q = qkv.new_empty((rows, heads, d))
    lib.lsl_rope_store(qkv.data_ptr(), qkv.stride(0), qkv.stride(1), rows, heads, kv_heads, d, d,
                       cos.data_ptr(), sin.data_ptr(), cos.stride(0), q.data_ptr(),
                       keys.data_ptr(), keys.stride(0), keys.stride(1), keys.stride(2),
                       values.data_ptr(), values.stride(0), values.stride(1), values.stride(2),
                       slot.data_ptr(), entry.data_ptr(), real, torch.get_num_threads())
    return q.permute(1, 0, 2).unsqueeze(0)
