"""Lookup drafting for the engine: process-wide acceptance statistics, one session per request.

``LookupDrafting`` lives as long as the engine. It owns one :class:`AcceptanceStats` per lookup
source, so what the context, corpus and output lookups have learned about their own accuracy (per
match length) carries over from request to request. ``session(context, spec, scope)`` builds a
request's drafters: a fresh ``ContextIndex`` over the prompt, plus the corpus and output indexes that the
request's :class:`LookupScope` grants, restricted to ``spec.sources``, merged by a ``Composer``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lookupspec.index import ContextIndex, LookupConfig
from lookupspec.params import LOOKUP_SOURCES, LookupScope, SpecParams

from .base import Drafter, DraftTree, ProposedTree
from .composer import Composer
from .lookup_drafter import LookupDrafter
from .stats import AcceptanceStats

__all__ = ["LookupDrafting", "LookupSession"]


class LookupSession:
    """One request's lookup drafters."""

    def __init__(self, drafting: LookupDrafting, context: Sequence[int], spec: SpecParams,
                 scope: LookupScope | None) -> None:
        cfg = drafting.cfg
        self.tokens: list[int] = [int(t) for t in context]
        self.store = ContextIndex(np.asarray(self.tokens, dtype=np.int32))
        drafters: list[Drafter] = []
        if "context" in spec.sources:
            drafters.append(LookupDrafter((self.store,), cfg, stats=drafting.stats["context"],
                                          name="context"))
        if scope is not None and "corpus" in spec.sources and scope.corpora:
            drafters.append(LookupDrafter(scope.corpora, cfg, stats=drafting.stats["corpus"], name="corpus"))
        if scope is not None and "output" in spec.sources and scope.output is not None:
            drafters.append(LookupDrafter((scope.output,), cfg, stats=drafting.stats["output"],
                                          name="output"))
        self.composer = Composer(drafters) if drafters else None
        self._empty = DraftTree.empty(())

    def extend(self, tokens: Sequence[int]) -> None:
        if tokens:
            self.tokens.extend(int(t) for t in tokens)
            self.store.extend(np.asarray(tokens, dtype=np.int32))

    def propose(self, max_nodes: int, chain_only: bool = False) -> DraftTree:
        """The composer's tree for the current context: at most ``max_nodes`` nodes, score-ordered."""
        if self.composer is None or max_nodes <= 0:
            return self._empty
        return self.composer.compose(self.tokens, max_nodes, chain_only=chain_only)

    def feedback(self, tree: ProposedTree, accepted: Sequence[int]) -> None:
        if self.composer is not None and isinstance(tree, DraftTree) and len(tree):
            self.composer.observe(tree, np.asarray(accepted, dtype=np.int64))


class LookupDrafting:
    """Engine-wide lookup configuration and per-source acceptance statistics."""

    def __init__(self, cfg: LookupConfig | None = None) -> None:
        self.cfg = cfg or LookupConfig()
        self.stats: dict[str, AcceptanceStats] = {name: AcceptanceStats() for name in LOOKUP_SOURCES}

    def session(self, context: Sequence[int], spec: SpecParams, scope: LookupScope | None) -> LookupSession:
        return LookupSession(self, context, spec, scope)

    def snapshot(self) -> dict[str, Any]:
        """Observed acceptance rate per source (for logs and metrics)."""
        return {name: s.acceptance_rate() for name, s in self.stats.items()}
