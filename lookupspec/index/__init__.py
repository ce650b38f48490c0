"""Token stores: suffix/n-gram structures and continuation statistics (numba).

Three stores, one lookup contract (``lookup.py``): ``store.lookup(tail, cfg) -> Continuations``.

- ``ContextStore`` (``context.py``): one per request; per-length hash chains, O(1) appends.
- ``CorpusStore`` (``corpus.py``): one per document collection; immutable suffix-array segments.
- ``OutputStore`` (``output.py``): one per namespace; the same segments, oldest outputs evicted.

All serialize with ``to_bytes`` / ``from_bytes`` (``serialize.py``); bad bytes raise
``CorruptStoreError``. ``reference.py`` holds the plain-Python twins the tests compare against.
"""

from .jitcache import ensure_coherent

ensure_coherent()  # before any cached kernel loads (see jitcache.py)

from .context import ContextStore  # noqa: E402
from .corpus import CorpusStore  # noqa: E402
from .lookup import KEY_DEPTH, SEP, Continuations, LookupConfig, TokenStore, empty_continuations  # noqa: E402
from .output import OutputStore  # noqa: E402
from .serialize import FORMAT_VERSION, CorruptStoreError  # noqa: E402

__all__ = [
    "FORMAT_VERSION",
    "KEY_DEPTH",
    "SEP",
    "ContextStore",
    "Continuations",
    "CorpusStore",
    "CorruptStoreError",
    "LookupConfig",
    "OutputStore",
    "TokenStore",
    "empty_continuations",
]
