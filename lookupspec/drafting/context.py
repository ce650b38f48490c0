"""``ContextLookup``: drafts from the request's own context (prompt + generated tokens).

Example::

    store = ContextStore(prompt_ids)
    drafter = ContextLookup(store, LookupConfig(), stats=process_wide_stats["context"])
    drafter.propose(tail, budget=16)   # -> [Candidate] (empty when nothing matches)
    store.extend(accepted_tokens)      # the engine keeps the store current
"""

from __future__ import annotations

from lookupspec.index import ContextStore, LookupConfig

from .lookup_drafter import LookupDrafter
from .stats import AcceptanceStats

__all__ = ["ContextLookup"]


class ContextLookup(LookupDrafter):
    def __init__(self, store: ContextStore, cfg: LookupConfig, *, stats: AcceptanceStats | None = None,
                 name: str = "context") -> None:
        super().__init__((store,), cfg, stats=stats, name=name)
        self.store = store
