"""Token indexes: suffix/n-gram structures and continuation statistics (numba).

Three stores, one lookup contract (``lookup.py``): ``store.lookup(tail, cfg) -> Continuations``.

- ``ContextIndex`` (``context.py``): one per request; per-length hash chains, O(1) appends.
- ``CorpusIndex`` (``corpus.py``): one per document collection; immutable suffix-array segments.
- ``OutputIndex`` (``output.py``): one per namespace; the same segments, oldest outputs evicted.

All serialize with ``to_bytes`` / ``from_bytes`` (``serialize.py``); bad bytes raise
``CorruptIndexError``. ``reference.py`` holds the plain-Python twins the tests compare against.
"""

from .jitcache import ensure_coherent

ensure_coherent()  # before any cached kernel loads (see jitcache.py)

from .context import ContextIndex  # noqa: E402
from .corpus import CorpusIndex  # noqa: E402
from .lookup import KEY_DEPTH, SEP, Continuations, LookupConfig, TokenIndex, empty_continuations  # noqa: E402
from .output import OutputIndex  # noqa: E402
from .serialize import FORMAT_VERSION, CorruptIndexError  # noqa: E402

__all__ = [
    "FORMAT_VERSION",
    "KEY_DEPTH",
    "SEP",
    "ContextIndex",
    "Continuations",
    "CorpusIndex",
    "CorruptIndexError",
    "LookupConfig",
    "OutputIndex",
    "TokenIndex",
    "empty_continuations",
]
