"""From a store's continuation tree to acceptance estimates (shared by the lookup drafters).

Per node ``v`` with parent ``u`` (the root's count is the number of occurrences examined):

    predicted(v) = count(v) / (count(u) + 1)       # empirical next-token frequency, shrunk: one
                                                   # occurrence predicts 1/2, not certainty
    prob(v)      = min(PROB_CAP, factor(L, depth(v)) * predicted(v))   # calibrated by AcceptanceStats
    score(v)     = prob(v) * score(u)              # score(root) = 1

``factor(L, d)`` is the source's observed/predicted acceptance ratio at the match length ``L`` of the
lookup and the node's depth ``d`` past the tail (``stats.py``), so long copied spans (accepted far more
often than 1/2, the more so the further a copy has run) earn high scores once observed, and a source
whose drafts keep failing stops being drafted from.

Worked example: occurrences 4, children ``x`` (count 3) and ``y`` (count 1), ``x`` has one child
``z`` (count 3); factor 1: predicted = 3/5, 1/5, 3/4; scores 0.6, 0.2, 0.45.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numba import njit

from lookupspec.index.lookup import Continuations, LookupConfig

from .base import Candidate
from .stats import AcceptanceStats

__all__ = ["PROB_CAP", "capped_config", "score_continuations", "score_nodes"]

PROB_CAP = 0.98  # no draft token is ever certain to be accepted


@njit(cache=True, nogil=True)
def score_nodes(parents, counts, depth, num_occ, factors, cap, pred, prob, score):
    """Fill pred / prob / score [n] float32 for a tree (parents [n], counts [n], depth [n] >= 1;
    parents[i] < i); factors [D + 1] float32 per depth, depths past D use factors[D]."""
    last = factors.shape[0] - 1
    for i in range(parents.shape[0]):
        p = parents[i]
        pc = counts[p] if p >= 0 else num_occ
        q = counts[i] / (pc + 1.0)
        pred[i] = q
        c = q * factors[min(depth[i], last)]
        if c > cap:
            c = cap
        prob[i] = c
        score[i] = c * (score[p] if p >= 0 else 1.0)


def score_continuations(cont: Continuations, source: str, stats: AcceptanceStats) -> Candidate:
    n = len(cont)
    pred = np.empty(n, np.float32)
    prob = np.empty(n, np.float32)
    score = np.empty(n, np.float32)
    score_nodes(cont.parents, cont.counts, cont.depth, cont.num_occurrences, stats.factors(cont.match_len),
                PROB_CAP, pred, prob, score)
    return Candidate(source, cont.match_len, cont.tokens, cont.parents, pred, prob, score)


def capped_config(cfg: LookupConfig, budget: int, cache: dict[int, LookupConfig]) -> LookupConfig:
    """cfg with max_nodes <= budget: nodes are emitted best-first, so the first ``budget`` nodes are
    the same either way and the lookup stops early. ``cache`` memoizes the copies per budget."""
    out = cache.get(budget)
    if out is None:
        capped = cfg if budget >= cfg.max_nodes else dataclasses.replace(cfg, max_nodes=max(1, int(budget)))
        out = cache[budget] = capped
    return out
