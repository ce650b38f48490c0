"""The lean forward's element-wise steps as native calls, built from ``layer_ops.c`` on first use.

Per layer the lean forward (:mod:`lookupspec.runtime.lean`) has about a dozen small steps around
attention: the rotary embedding (two products, ``rotate_half``'s negation and concatenation, a sum),
the two indexed copies of the rows' keys and values into the KV pool, and RMSNorm's ``rsqrt`` and two
products, twice. As torch ops each is a dispatch, an allocation and a pass over memory, which for a
decode step's few rows costs more than the arithmetic. Here they are one call each, with the same
arithmetic: every product and sum rounded on its own as torch rounds it (the C is built with
``-ffp-contract=off``), so the logits and KV entries stay bit-identical to the torch ops
(``tests/runtime/test_lean.py`` compares them with transformers' forward).

The residual sum and the RMSNorm after it go further (:func:`add_rms_norm`: one pass for ``h + y``,
``pow(2).mean(-1)`` and the scaling): the mean of squares is a reduction, and its bits depend on the
order of the additions, so ``layer_ops.c`` adds them in the order of torch's own kernel (a cascade of four
levels of four interleaved vector accumulators; ``aten/src/ATen/native/cpu/SumKernel.cpp``).
That order follows the vector width torch's kernel was built for (8 floats with AVX2, 16 with
AVX-512), so :func:`sum_lanes` finds it by comparing whole steps with torch's ops on random rows,
once per hidden size, and where neither width gives torch's bits the mean stays torch's
(:func:`rms_norm`: only the scaling is native).

``LOOKUPSPEC_LEAN_NATIVE``: ``auto`` (default: the library where it builds), ``native`` (a failed
build is an error) or ``torch`` (the torch ops).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .loader import LazyLibrary

__all__ = ["add_rms_norm", "kernel", "rms_norm", "rope_store", "sum_lanes"]

_SOURCE = Path(__file__).with_name("layer_ops.c")


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, f32, i32 = ctypes.c_void_p, ctypes.c_long, ctypes.c_float, ctypes.c_int
    lib.layer_rope_store.argtypes = [p, i64, i64, i64, i64, i64, i64, i64, p, p, i64, p,
                                   p, i64, i64, i64, p, i64, i64, i64, p, p, i64, i32]
    lib.layer_rope_store.restype = None
    lib.layer_rms_scale.argtypes = [p, i64, p, p, f32, p, i64, i64, i32]
    lib.layer_rms_scale.restype = None
    lib.layer_add_rms.argtypes = [p, p, p, f32, p, i64, i64, i32, i32]
    lib.layer_add_rms.restype = None


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
    lib.layer_rms_scale(x.data_ptr(), dim, variance.data_ptr(), weight.data_ptr(), eps, out.data_ptr(),
                      rows, dim, torch.get_num_threads())
    return out


def add_rms_norm(lib: ctypes.CDLL, h: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor, eps: float,
                 lanes: int) -> torch.Tensor:
    """``h += y`` in place (when ``y`` is given), then transformers' LlamaRMSNorm of ``h``, in one
    pass: the mean of squares summed as torch sums it with ``lanes``-wide vectors (see
    :func:`sum_lanes`). ``h``: contiguous float32 [.., dim]; ``y`` of its shape."""
    if not h.is_contiguous() or (y is not None and y.shape != h.shape):
        raise ValueError("add_rms_norm takes a contiguous h and a y of its shape")
    if y is not None:
        y = y.contiguous()
    out = torch.empty_like(h)
    dim = h.shape[-1]
    lib.layer_add_rms(h.data_ptr(), None if y is None else y.data_ptr(), weight.data_ptr(), eps,
                      out.data_ptr(), h.numel() // dim, dim, lanes, torch.get_num_threads())
    return out


_LANES: dict[int, int | None] = {}


def sum_lanes(lib: ctypes.CDLL, dim: int) -> int | None:
    """The vector width (16 or 8 floats) with which ``layer_ops.c`` sums squares in the order of torch's
    own reduction for rows of ``dim`` floats (torch's kernels follow the CPU: AVX-512 or AVX2), or
    None when neither gives torch's bits and the mean must stay torch's. Found once per size by
    comparing whole residual-and-norm steps with the torch ops on random rows (1, 7 and 130 of them:
    the last take torch's multi-threaded path), magnitudes over six decades."""
    if dim not in _LANES:
        from ..lean import _rms_norm

        gen = torch.Generator().manual_seed(dim)
        weight = torch.randn(dim, generator=gen)
        found = None
        for lanes in (16, 8):
            same = True
            for rows in (1, 7, 130):
                scale = torch.logspace(-3, 3, rows).unsqueeze(1)
                h, y = torch.randn(rows, dim, generator=gen) * scale, torch.randn(rows, dim, generator=gen)
                want_h = h + y
                want = _rms_norm(want_h, weight, 1e-6)
                got = add_rms_norm(lib, h, y, weight, 1e-6, lanes)
                same = same and torch.equal(h, want_h) and torch.equal(got, want)
            if same:
                found = lanes
                break
        _LANES[dim] = found
    return _LANES[dim]


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
    slot, entry = slot.to(torch.int64).contiguous(), entry.to(torch.int64).contiguous()  # C reads longs
    q = qkv.new_empty((rows, heads, d))
    lib.layer_rope_store(qkv.data_ptr(), qkv.stride(0), qkv.stride(1), rows, heads, kv_heads, d, d,
                       cos.data_ptr(), sin.data_ptr(), cos.stride(0), q.data_ptr(),
                       keys.data_ptr(), keys.stride(0), keys.stride(1), keys.stride(2),
                       values.data_ptr(), values.stride(0), values.stride(1), values.stride(2),
                       slot.data_ptr(), entry.data_ptr(), real, torch.get_num_threads())
    return q.permute(1, 0, 2).unsqueeze(0)
