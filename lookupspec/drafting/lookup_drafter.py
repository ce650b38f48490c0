"""The lookup drafter: ask one or more token stores, score by counts and statistics.

One class serves the three lookup sources; the source name is an argument: ``context`` over the
request's own ``ContextIndex``, ``corpus`` over the ``CorpusIndex`` of each collection it may read,
``output`` over the namespace's ``OutputIndex``. Example::

    drafter = LookupDrafter((docs_a, docs_b), LookupConfig(), stats=process_wide["corpus"], name="corpus")
    drafter.propose(tail, budget=16)   # -> [Candidate], one per store with a match

A ``LookupDrafter`` offers the ``Drafter`` protocol (``propose`` returns scored ``Candidate`` objects)
and, for the composer's per-step hot path, ``propose_into``: the stores write their trees straight
into the composer's buffer and only the candidate table comes back, so a decode step boxes no
intermediate arrays (each array numba hands back to Python costs about a microsecond).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lookupspec.index import LookupConfig, TokenIndex
from lookupspec.warmup import warm_drafting

from .base import Candidate
from .scoring import capped_config, score_continuations
from .stats import AcceptanceStats

__all__ = ["LookupDrafter"]


class LookupDrafter:
    """Drafts from ``stores`` (one candidate per store with a match) under one source name."""

    def __init__(self, stores: Sequence[TokenIndex], cfg: LookupConfig, *,
                 stats: AcceptanceStats | None = None, name: str) -> None:
        if not isinstance(cfg, LookupConfig):
            raise TypeError(f"cfg must be a LookupConfig, got {type(cfg).__name__}")
        warm_drafting()  # its scoring kernel: compiled (or loaded) now, not mid-request
        self.stores = tuple(stores)
        self.cfg = cfg
        self.stats = stats if stats is not None else AcceptanceStats()
        self.name = name
        self._cfgs: dict[int, LookupConfig] = {}

    def node_capacity(self, budget: int) -> int:
        """Most nodes ``propose_into`` may write for this budget."""
        return len(self.stores) * min(self.cfg.max_nodes, max(1, int(budget)))

    def propose(self, tail: np.ndarray, budget: int) -> list[Candidate]:
        cfg = capped_config(self.cfg, budget, self._cfgs)
        out = []
        for store in self.stores:
            cont = store.lookup(tail, cfg)
            if len(cont):
                out.append(score_continuations(cont, self.name, self.stats))
        return out

    def propose_into(self, tail: np.ndarray, budget: int, out: np.ndarray,
                     at: int) -> list[tuple[int, int, int, int, np.ndarray]]:
        """Write each store's tree to ``out`` [5, >= at + node_capacity(budget)] int64 from column ``at``;
        returns (start column, nodes, match_len, num_occurrences, calibration factors per depth) per
        candidate, for the composer to score (``scoring.py``)."""
        cfg = self._cfgs.get(budget) or capped_config(self.cfg, budget, self._cfgs)
        found = []
        for store in self.stores:
            L, n, num = store.lookup_into(tail, cfg, out, at)
            if n:
                found.append((at, n, L, num, self.stats.factors(L)))
                at += n
        return found

    def observe(self, match_len: np.ndarray, predicted: np.ndarray, accepted: np.ndarray,
                depth: np.ndarray | None = None) -> None:
        self.stats.observe(match_len, predicted, accepted, depth)
