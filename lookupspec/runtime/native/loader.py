"""Building and loading the runtime's C kernels (``matmul.c``, ``attention.c``, ``layer_ops.c``, and
their shared ``simd.h``) with the system compiler, on first use, and the setting that turns each on
or off.

Each source is compiled with ``-O3 -march=<arch> -fopenmp -ffp-contract=off`` into
``<kernel cache>/<stem>-<digest>.so`` (the cache: ``$LOOKUPSPEC_KERNEL_CACHE``, else
``$LOOKUPSPEC_HOME/kernels``); the digest covers the source and the headers beside it, the compiler
and flags and the CPU's model and flags, so a build is reused until one of them changes, and one
cache can serve any number of homes (the test suite gives every server it starts a home of its own
and one shared kernel cache: a build of ``matmul.c`` takes ~15-60 s of one core). Concurrent processes
(test workers, replicas) may build at once: each compiles beside the target and renames it into
place. The library links libgomp by soname, so loaded after torch it runs on torch's OpenMP threads.
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
from collections.abc import Callable
from pathlib import Path

__all__ = ["LazyLibrary", "build", "kernel_cache"]

log = logging.getLogger(__name__)

_FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC")


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


def kernel_cache() -> Path:
    """Where builds go: ``$LOOKUPSPEC_KERNEL_CACHE``, else ``$LOOKUPSPEC_HOME/kernels``."""
    env = os.environ.get("LOOKUPSPEC_KERNEL_CACHE")
    if env:
        return Path(env).expanduser()
    from lookupspec.models import lookupspec_home

    return lookupspec_home() / "kernels"


def build(source: Path, arch: str = "native", directory: Path | None = None) -> ctypes.CDLL:
    """Compile ``source`` for ``-march=arch`` into ``directory`` (default :func:`kernel_cache`)
    unless a build of the same source, flags and CPU is there, and load it. Raises OSError where
    it cannot (not Linux x86-64, no compiler, the compiler failed)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise OSError(f"the CPU kernels are built for Linux on x86-64, not {platform.system()} "
                      f"{platform.machine()}")
    cc = _compiler()
    if cc is None:
        raise OSError("no C compiler (set CC, or install gcc)")
    text = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    flags = (*_FLAGS, f"-march={arch}")
    digest = hashlib.sha256(text + " ".join((cc, *flags)).encode() + _cpu_key().encode()).hexdigest()[:20]
    if directory is None:
        directory = kernel_cache()
    out = directory / f"{source.stem}-{digest}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            run = subprocess.run([cc, *flags, str(source), "-o", tmp], capture_output=True, text=True,
                                 timeout=120)
            if run.returncode != 0:
                raise OSError(f"{cc} failed: {run.stderr.strip()[-800:]}")
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return ctypes.CDLL(str(out))


class LazyLibrary:
    """One kernel library, built on first use, as a setting asks.

    ``env`` names the setting: ``auto`` (default: the kernel where it builds), ``on`` (a failed build
    is an error) or ``off`` (never built). ``declare(lib)`` sets the functions' ctypes signatures."""

    def __init__(self, source: Path, declare: Callable[[ctypes.CDLL], None], env: str, on: str, off: str,
                 fallback: str) -> None:
        self.source, self.declare, self.env = source, declare, env
        self.on, self.off, self.fallback = on, off, fallback
        self._lib: ctypes.CDLL | None = None
        self.error: str | None = None  # why get() returned None (None when it did not, or was not asked)
        self._tried = False
        self._lock = threading.Lock()

    def choice(self) -> str:
        """The setting: ``auto``, ``on`` or ``off`` (their names as given); ValueError on another."""
        value = os.environ.get(self.env, "auto").strip().lower() or "auto"
        allowed = ("auto", self.on, self.off)
        if value not in allowed:
            raise ValueError(f"{self.env} must be one of {', '.join(allowed)}, got {value!r}")
        return value

    def build(self, arch: str = "native", directory: Path | None = None) -> ctypes.CDLL:
        """A build for ``-march=arch`` (in ``directory``), declared; whatever the setting says."""
        lib = build(self.source, arch, directory)
        self.declare(lib)
        return lib

    def get(self) -> ctypes.CDLL | None:
        """The library, or None where it cannot be built or the setting is ``off``. Raises when the
        setting is ``on`` and the build failed."""
        choice = self.choice()
        if choice == self.off:
            return None
        with self._lock:
            if not self._tried:
                self._tried = True
                try:
                    self._lib = self.build()
                except (OSError, subprocess.SubprocessError) as exc:
                    self.error = str(exc)
                    log.info("%s unavailable (%s); %s", self.source.name, self.error, self.fallback)
        if self._lib is None and choice == self.on:
            raise RuntimeError(f"{self.env}={self.on}, but {self.source.name} could not be built: "
                               f"{self.error}")
        return self._lib
