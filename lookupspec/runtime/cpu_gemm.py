"""A streaming float32 matmul for decoding on x86 CPUs, built from ``sgemm.c`` on first use.

A decode step multiplies a few rows (one per sequence, plus draft rows) by every weight of the
model. oneDNN's packed products read each weight once, but for 2-32 rows they run well below both
the memory's and the FMA units' speed (SmolLM2-135M's 121 products per step, 2-core Xeon with
AVX-512: 39 ms at 8 rows, 48 ms at 16, against 35 ms at one). ``sgemm.c`` keeps a tile of rows x
48-64 columns in registers while the weights stream past, so rows are nearly free until the FMA
units are busy (the same products, interleaved with oneDNN's by ``lookupspec bench-linear``: 25 ms
at one row, 28 ms at 8, 37 ms at 16, and on par at prompt-chunk sizes: 166 against 157 ms at 128).

Every output is one fused multiply-add chain over k in order, so a row's bits do not depend on the
other rows, the tiling or the thread count: batch-invariant by construction, and fused projections
equal their parts. The arithmetic is float32 in another summation order than oneDNN's or MKL's, so
logits differ from theirs in the last bits, as they differ from each other.

Built with the system C compiler (``$CC``, else ``cc``/``gcc``) and ``-march=native -fopenmp`` into
``$LOOKUPSPEC_HOME/kernels`` (about a second, once per source and CPU). It links libgomp by soname,
so loaded after torch it runs on torch's own OpenMP threads. :func:`kernel` returns ``None`` (and
the packed layers keep oneDNN) where it cannot be built: no compiler, no AVX2+FMA, not Linux x86.
``LOOKUPSPEC_CPU_LINEAR=onednn`` turns it off; ``=stream`` makes a failed build an error.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

__all__ = ["StreamWeights", "backend_choice", "kernel", "kernel_error"]

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("sgemm.c")
_FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC")
_BACKENDS = ("auto", "stream", "onednn")

_lib: ctypes.CDLL | None = None
_error: str | None = None
_tried = False
_lock = threading.Lock()


def backend_choice() -> str:
    """``LOOKUPSPEC_CPU_LINEAR``: ``auto`` (default: the streaming kernel where it builds, else
    oneDNN), ``stream`` or ``onednn``."""
    value = os.environ.get("LOOKUPSPEC_CPU_LINEAR", "auto").strip().lower() or "auto"
    if value not in _BACKENDS:
        raise ValueError(f"LOOKUPSPEC_CPU_LINEAR must be one of {', '.join(_BACKENDS)}, got {value!r}")
    return value


def _cpu_key() -> str:
    """What ``-march=native`` depends on: the CPU's model and flags."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = [platform.processor()]
    return "\n".join(lines)


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def _build(arch: str = "native", directory: Path | None = None) -> ctypes.CDLL:
    """Compile ``sgemm.c`` for ``-march=arch`` into ``directory`` (default ``$LOOKUPSPEC_HOME/kernels``)
    unless a build of the same source, flags and CPU is there, and load it."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise OSError(f"the streaming kernel is built for Linux on x86-64, not {platform.system()} "
                      f"{platform.machine()}")
    cc = _compiler()
    if cc is None:
        raise OSError("no C compiler (set CC, or install gcc)")
    source = _SOURCE.read_bytes()
    flags = (*_FLAGS, f"-march={arch}")
    digest = hashlib.sha256(source + " ".join((cc, *flags)).encode() + _cpu_key().encode()).hexdigest()[:20]
    if directory is None:
        from lookupspec.models import lookupspec_home

        directory = lookupspec_home() / "kernels"
    out = directory / f"sgemm-{digest}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        # build beside the target and rename: concurrent processes (test workers) may build at once
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            run = subprocess.run([cc, *flags, str(_SOURCE), "-o", tmp], capture_output=True, text=True,
                                 timeout=120)
            if run.returncode != 0:
                raise OSError(f"{cc} failed: {run.stderr.strip()[-800:]}")
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lib = ctypes.CDLL(str(out))
    p, i64 = ctypes.c_void_p, ctypes.c_long
    lib.lsg_linear.argtypes = [p, i64, i64, p, i64, p, p, ctypes.c_int]
    lib.lsg_linear.restype = None
    lib.lsg_pack.argtypes = [p, p, i64, i64]
    lib.lsg_pack.restype = None
    lib.lsg_unpack.argtypes = [p, p, i64, i64]
    lib.lsg_unpack.restype = None
    lib.lsg_isa.restype = ctypes.c_int
    return lib


def kernel() -> ctypes.CDLL | None:
    """The built library, or None where it cannot be built (or ``LOOKUPSPEC_CPU_LINEAR=onednn``);
    :func:`kernel_error` says why. Raises with ``LOOKUPSPEC_CPU_LINEAR=stream`` when the build fails."""
    global _lib, _error, _tried
    choice = backend_choice()
    if choice == "onednn":
        return None
    with _lock:
        if not _tried:
            _tried = True
            try:
                _lib = _build()
            except (OSError, subprocess.SubprocessError) as exc:
                _error = str(exc)
                log.info("streaming CPU matmul unavailable (%s); packed layers use oneDNN", _error)
    if _lib is None and choice == "stream":
        raise RuntimeError(f"LOOKUPSPEC_CPU_LINEAR=stream, but the kernel could not be built: {_error}")
    return _lib


def kernel_error() -> str | None:
    """Why :func:`kernel` returned None (None when it did not, or was not asked)."""
    return _error


class StreamWeights:
    """A float32 weight ``[out_features, in_features]`` (and bias) packed for ``sgemm.c``:
    ``self(x)`` is ``x @ W.T + b`` over the last dimension of ``x``."""

    def __init__(self, lib: ctypes.CDLL, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        weight = weight.detach().to(torch.float32).contiguous()
        self.lib = lib
        self.out_features, self.in_features = weight.shape
        blocks = (self.out_features + 15) // 16
        self.packed = torch.empty(blocks, self.in_features, 16)
        lib.lsg_pack(weight.data_ptr(), self.packed.data_ptr(), self.out_features, self.in_features)
        self.bias = None if bias is None else bias.detach().to(torch.float32).contiguous().clone()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        grad = x.requires_grad and torch.is_grad_enabled()
        if x.dtype != torch.float32 or x.device.type != "cpu" or grad:
            raise TypeError("the streaming matmul takes float32 CPU inputs without autograd")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input has {x.shape[-1]} features, the layer {self.in_features}")
        x2 = x.reshape(-1, self.in_features).contiguous()
        y = torch.empty(x2.shape[0], self.out_features)
        if x2.shape[0]:
            self.lib.lsg_linear(x2.data_ptr(), x2.shape[0], self.in_features, self.packed.data_ptr(),
                                self.out_features, None if self.bias is None else self.bias.data_ptr(),
                                y.data_ptr(), torch.get_num_threads())
        return y.reshape(*x.shape[:-1], self.out_features)

    def dense(self) -> torch.Tensor:
        """The weight in its ``[out_features, in_features]`` layout (a new tensor)."""
        out = torch.empty(self.out_features, self.in_features)
        self.lib.lsg_unpack(self.packed.data_ptr(), out.data_ptr(), self.out_features, self.in_features)
        return out
