"""``CorpusLookup``: drafts from one or more document collections (a request may name several).

Each collection with a match yields its own candidate (its match length may differ); the composer
merges them. All collections share one source name and one ``AcceptanceStats``.

Example::

    drafter = CorpusLookup([docs_a, docs_b], LookupConfig(), stats=process_wide_stats["corpus"])
    drafter.propose(tail, budget=16)
"""

from __future__ import annotations

from collections.abc import Sequence

from lookupspec.index import CorpusStore, LookupConfig

from .lookup_drafter import LookupDrafter
from .stats import AcceptanceStats

__all__ = ["CorpusLookup"]


class CorpusLookup(LookupDrafter):
    def __init__(self, stores: Sequence[CorpusStore], cfg: LookupConfig, *,
                 stats: AcceptanceStats | None = None, name: str = "corpus") -> None:
        super().__init__(tuple(stores), cfg, stats=stats, name=name)
