"""Keep numba's on-disk kernel caches coherent across modules.

numba keys a cached kernel on the contents of *its own* source file only. When a kernel calls one
defined in another file (``context._lookup`` -> ``tree.expand_tree``) and only that other file
changes, the cache keeps serving machine code built from the old callee: stale behaviour, and in
this project a kernel that ran 3x slower than its source (found the hard way). ``ensure_coherent``
hashes every module here and in ``lookupspec/drafting`` that defines kernels; when the hash differs
from the one recorded at the last check, it deletes those modules' cache files (wherever numba's
own locators put them), so everything recompiles once. An unchanged install never triggers it.

Cost at import: reading and hashing about 200 kB of source (about a millisecond).
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

__all__ = ["ensure_coherent"]

_DIRS = (Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent / "drafting")


def _kernel_sources() -> list[Path]:
    out = []
    for d in _DIRS:
        for p in sorted(d.glob("*.py")):
            with contextlib.suppress(OSError):
                if any(line.startswith("@njit") for line in p.read_text(encoding="utf-8").splitlines()):
                    out.append(p)
    return out


def _cache_dir(source: Path) -> Path:
    """Where numba caches kernels of ``source`` (its locators, in its order; in-tree as a fallback)."""
    def probe() -> None:  # numba's locators want a function; only its file and line are used
        pass

    try:
        from numba.core import caching

        names = vars(caching)
        impl = names.get("CacheImpl") or names["_CacheImpl"]  # the name differs across numba versions
        for cls in impl._locator_classes:
            loc = cls.from_function(probe, str(source))
            if loc is not None:
                return Path(loc.get_cache_path())
    except Exception:  # numba internals: fall back to the default location
        pass
    return source.parent / "__pycache__"


def ensure_coherent() -> None:
    files = _kernel_sources()
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    digest = h.hexdigest()
    stamp = _DIRS[0] / "__pycache__" / "numba-kernel-sources.sha256"
    with contextlib.suppress(OSError):
        if stamp.read_text() == digest:
            return
    try:
        for p in files:
            cache = _cache_dir(p)
            for f in [*cache.glob(f"{p.stem}.*.nbi"), *cache.glob(f"{p.stem}.*.nbc")]:
                f.unlink(missing_ok=True)
        stamp.parent.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:  # read-only install: the sources cannot have changed under it
        pass

