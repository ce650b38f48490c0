"""A streaming float32 matmul for decoding on x86 CPUs, built from ``matmul.c`` on first use.

A decode step multiplies a few rows (one per sequence, plus draft rows) by every weight of the
model. oneDNN's packed products read each weight once, but for 2-32 rows they run well below both
the memory's and the FMA units' speed. ``matmul.c`` keeps a tile of rows x 48-64 columns in
registers while the weights stream past, so rows are nearly free until the FMA units are busy, and
it is on par with oneDNN at prompt-chunk sizes (``python -m tools bench-linear`` measures both). Past a
few rows, the tiles of each panel of columns also prefetch the next panel, so the memory keeps
streaming while the panel's later row tiles compute from cache; 9-12 rows (a batch of 8 with a few
draft nodes, one sequence's tree) take one tile for all the rows, so each weight is still read once.

Every output is one fused multiply-add chain over k in order, so a row's bits do not depend on the
other rows, the tiling or the thread count: batch-invariant by construction, and fused projections
equal their parts. The arithmetic is float32 in another summation order than oneDNN's or MKL's, so
logits differ from theirs in the last bits, as they differ from each other.

Built by :mod:`.loader` (``$CC``, else ``cc``/``gcc``, ``-march=native -fopenmp``, into
``$LOOKUPSPEC_HOME/kernels``, once per source and CPU). :func:`kernel` returns ``None`` (and the
packed layers keep oneDNN) where it cannot be built: no compiler, no AVX2+FMA, not Linux x86.
``LOOKUPSPEC_CPU_LINEAR=onednn`` turns it off; ``=stream`` makes a failed build an error.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .loader import LazyLibrary

__all__ = ["StreamWeights", "backend_choice", "kernel", "kernel_error", "product_buffers"]

_SOURCE = Path(__file__).with_name("matmul.c")


def _declare(lib: ctypes.CDLL) -> None:
    p, i64 = ctypes.c_void_p, ctypes.c_long
    lib.matmul_f32.argtypes = [p, i64, i64, p, i64, p, p, ctypes.c_int]
    lib.matmul_f32.restype = None
    lib.matmul_pack.argtypes = [p, p, i64, i64]
    lib.matmul_pack.restype = None
    lib.matmul_unpack.argtypes = [p, p, i64, i64]
    lib.matmul_unpack.restype = None
    lib.matmul_isa.restype = ctypes.c_int
    # x, M, K, planes q, hb, d, dm, sc, mn, type, N, bias, y, threads (see quantized.py)
    lib.matmul_quant.argtypes = [p, i64, i64, p, p, p, p, p, p, ctypes.c_int, i64, p, p, ctypes.c_int]
    lib.matmul_quant.restype = None
    lib.matmul_quant_dequant.argtypes = [p, p, p, p, p, p, ctypes.c_int, i64, i64, p]
    lib.matmul_quant_dequant.restype = None
    lib.matmul_quant_rows.argtypes = [p, p, p, p, p, p, ctypes.c_int, i64, p, i64, p]
    lib.matmul_quant_rows.restype = None


_LIBRARY = LazyLibrary(_SOURCE, _declare, "LOOKUPSPEC_CPU_LINEAR", on="stream", off="onednn",
                       fallback="packed layers use oneDNN")


def backend_choice() -> str:
    """``LOOKUPSPEC_CPU_LINEAR``: ``auto`` (default: the streaming kernel where it builds, else
    oneDNN), ``stream`` or ``onednn``."""
    return _LIBRARY.choice()


def kernel() -> ctypes.CDLL | None:
    """The built library, or None where it cannot be built (or ``LOOKUPSPEC_CPU_LINEAR=onednn``);
    :func:`kernel_error` says why. Raises with ``LOOKUPSPEC_CPU_LINEAR=stream`` when the build fails."""
    return _LIBRARY.get()


def kernel_error() -> str | None:
    """Why :func:`kernel` returned None (None when it did not, or was not asked)."""
    return _LIBRARY.error


def product_buffers(x: torch.Tensor, in_features: int, out_features: int,
                    kernel: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` [..., in_features] checked for a native product (float32, CPU, no autograd) and flattened
    to contiguous rows, and the output buffer [rows, out_features] the kernel writes."""
    # the common case first, in as few tensor calls as can be: a decode step makes ~120 products,
    # and the general checks below cost more than a small product's kernel
    if (x.dim() == 2 and x.dtype is torch.float32 and x.is_cpu and x.shape[1] == in_features
            and x.is_contiguous() and not (x.requires_grad and torch.is_grad_enabled())):
        return x, torch.empty(x.shape[0], out_features)
    if x.dtype != torch.float32 or x.device.type != "cpu" or (x.requires_grad and torch.is_grad_enabled()):
        raise TypeError(f"{kernel} takes float32 CPU inputs without autograd")
    if x.shape[-1] != in_features:
        raise ValueError(f"input has {x.shape[-1]} features, the layer {in_features}")
    x2 = x.reshape(-1, in_features).contiguous()
    return x2, torch.empty(x2.shape[0], out_features)


class StreamWeights:
    """A float32 weight ``[out_features, in_features]`` (and bias) packed for ``matmul.c``:
    ``self(x)`` is ``x @ W.T + b`` over the last dimension of ``x``."""

    def __init__(self, lib: ctypes.CDLL, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        weight = weight.detach().to(torch.float32).contiguous()
        self.lib = lib
        self.out_features, self.in_features = weight.shape
        blocks = (self.out_features + 15) // 16
        self.packed = torch.empty(blocks, self.in_features, 16)
        lib.matmul_pack(weight.data_ptr(), self.packed.data_ptr(), self.out_features, self.in_features)
        self.bias = None if bias is None else bias.detach().to(torch.float32).contiguous().clone()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x2, y = product_buffers(x, self.in_features, self.out_features, "the streaming matmul")
        if x2.shape[0]:
            self.lib.matmul_f32(x2.data_ptr(), x2.shape[0], self.in_features, self.packed.data_ptr(),
                                self.out_features, None if self.bias is None else self.bias.data_ptr(),
                                y.data_ptr(), torch.get_num_threads())
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def dense(self) -> torch.Tensor:
        """The weight in its ``[out_features, in_features]`` layout (a new tensor)."""
        out = torch.empty(self.out_features, self.in_features)
        self.lib.matmul_unpack(self.packed.data_ptr(), out.data_ptr(), self.out_features, self.in_features)
        return out
