"""``OutputLookup``: drafts from the namespace's earlier outputs (the shared output cache).

Example::

    drafter = OutputLookup(namespace_outputs, LookupConfig(), stats=process_wide_stats["output"])
    drafter.propose(tail, budget=16)
"""

from __future__ import annotations

from lookupspec.index import LookupConfig, OutputStore

from .lookup_drafter import LookupDrafter
from .stats import AcceptanceStats

__all__ = ["OutputLookup"]


class OutputLookup(LookupDrafter):
    def __init__(self, store: OutputStore, cfg: LookupConfig, *, stats: AcceptanceStats | None = None,
                 name: str = "output") -> None:
        super().__init__((store,), cfg, stats=stats, name=name)
        self.store = store
