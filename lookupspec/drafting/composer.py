"""The composer: every drafter's candidates merged into one draft tree under a node budget.

Merging. Candidates are laid over one trie keyed by (parent, token), so shared prefixes collapse and
no node ever has two children with the same token. A node proposed by several sources keeps the
highest score (and that source's attribution, match length and prediction). Each source's scores
never grow along a path, so neither do the merged ones.

Selection. Nodes are sorted by score desc, then depth asc, then first appearance; the first
``budget`` nodes (with score >= ``min_score``) are kept. A child never outscores its parent and wins
no tie against it, so every prefix of that order is closed under parents: it is a tree, and the one
of its size with the largest expected number of accepted tokens (the sum of its path scores). The
output keeps that order, so ``tree.prefix(k)`` is the best k-node tree for any k <= budget.
``chain_only`` instead follows the best-scoring child from the root (for engines without tree
attention).

Feedback. ``observe(tree, accepted)`` tells each source, for its nodes that were tested (parent
accepted, or child of the root), what it predicted and what happened.

Worked example: context proposes ``x y`` (scores 0.8, 0.6) and corpus ``x z`` (0.7, 0.5) and ``w``
(0.4). Merged: ``x`` 0.8 (context), ``y`` 0.6, ``z`` 0.5, ``w`` 0.4; with budget 3 the tree is
``x`` -> {``y``, ``z``}, expected accepted tokens 1.9.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import njit

from lookupspec.index.lookup import KEY_DEPTH
from lookupspec.warmup import warm_drafting

from .base import Drafter, DraftTree
from .scoring import PROB_CAP

__all__ = ["Composer"]

# Columns of the candidate table handed to the kernel.
_START, _N, _MLEN, _NUM, _SRC, _SCORED = range(6)


@njit(cache=True, nogil=True)
def _compose(nodes, est, cands, factors, budget, min_score, chain_only, cap, ws, fws):
    """Score, merge and select in one pass.

    nodes [5, N] int64: token, parent (index within its candidate, -1 = root), count, last_seen, depth
    est [2, N] float32: predicted, score (given for scored candidates, computed here for the others)
    cands [C, 6] int64: start column, nodes, match_len, num_occurrences, source, scored
    factors [C, D + 1] float32: calibration factors of each candidate's source at its match length,
    per node depth (depths past D use column D)
    ws: int64 scratch of >= 8 * N + 32 entries; fws: float32 scratch of >= 2 * N entries
    Returns ints [5, k] int32 (token, parent, source, match_len, depth) and floats [2, k] float32
    (score, predicted), nodes in selection order (parents first).
    """
    n_all = 0
    for c in range(cands.shape[0]):
        n_all += cands[c, _N]
        if cands[c, _SCORED] == 0:
            start = cands[c, _START]
            num = cands[c, _NUM]
            last = factors.shape[1] - 1
            for i in range(start, start + cands[c, _N]):
                p = nodes[1, i]
                pc = nodes[2, start + p] if p >= 0 else num
                q = nodes[2, i] / (pc + 1.0)
                pr = q * factors[c, min(nodes[4, i], last)]
                if pr > cap:
                    pr = cap
                est[0, i] = q
                est[1, i] = pr * (est[1, start + p] if p >= 0 else 1.0)
    size = 16
    while size < 2 * n_all:
        size <<= 1
    merged = ws[:6 * n_all].reshape((6, n_all))  # token, parent, source, match_len, depth, order key
    mapped = ws[6 * n_all:7 * n_all]
    table = ws[7 * n_all:7 * n_all + size]  # open addressing on (merged parent, token)
    table[:] = -1
    m_score = fws[:n_all]
    m_pred = fws[n_all:2 * n_all]
    m = 0
    g = 0  # running index over all candidate nodes (mapped[] is indexed by it)
    for c in range(cands.shape[0]):
        start = cands[c, _START]
        base = g
        for i in range(start, start + cands[c, _N]):
            tok = nodes[0, i]
            p = nodes[1, i]
            mp = mapped[base + p] if p >= 0 else -1
            h = ((mp + 1) * 0x9E3779B1 + tok * 0x85EBCA77) & 0x7FFFFFFFFFFFFFFF
            s = (h ^ (h >> 17)) & (size - 1)
            while True:
                j = table[s]
                if j < 0:
                    table[s] = m
                    merged[0, m] = tok
                    merged[1, m] = mp
                    merged[2, m] = cands[c, _SRC]
                    merged[3, m] = cands[c, _MLEN]
                    merged[4, m] = 1 if mp < 0 else merged[4, mp] + 1
                    m_score[m] = est[1, i]
                    m_pred[m] = est[0, i]
                    mapped[g] = m
                    m += 1
                    break
                if merged[1, j] == mp and merged[0, j] == tok:
                    if est[1, i] > m_score[j]:
                        m_score[j] = est[1, i]
                        m_pred[j] = est[0, i]
                        merged[2, j] = cands[c, _SRC]
                        merged[3, j] = cands[c, _MLEN]
                    mapped[g] = j
                    break
                s = (s + 1) & (size - 1)
            g += 1
    if chain_only:
        order = mapped[:min(budget, m)]  # mapped is free again
        k = 0
        cur = -1
        while k < budget:
            best = -1
            for j in range(m):
                if merged[1, j] != cur or m_score[j] < min_score:
                    continue
                if best < 0 or m_score[j] > m_score[best]:
                    best = j
            if best < 0:
                break
            order[k] = best
            k += 1
            cur = best
    else:
        # One sort on a composite key: score desc (the bits of a non-negative float32 order like its
        # value), then depth asc, then first appearance.
        bits = m_score[:m].view(np.int32)
        for j in range(m):
            merged[5, j] = ((np.int64(0x7FFFFFFF) - bits[j]) << 32) | (merged[4, j] << 20) | j
        order = np.argsort(merged[5, :m])
        k = 0
        while k < m and k < budget and m_score[order[k]] >= min_score:
            k += 1
    ints = np.empty((5, k), np.int32)
    floats = np.empty((2, k), np.float32)
    pos = table  # reuse: merged node -> output index (parents are placed before children)
    for i in range(k):
        j = order[i]
        pos[j] = i
        ints[0, i] = merged[0, j]
        ints[1, i] = pos[merged[1, j]] if merged[1, j] >= 0 else -1
        ints[2, i] = merged[2, j]
        ints[3, i] = merged[3, j]
        ints[4, i] = merged[4, j]
        floats[0, i] = m_score[j]
        floats[1, i] = m_pred[j]
    return ints, floats


class Composer:
    """Asks every drafter each step and returns one draft tree; routes acceptance feedback back.

    One composer per request (it keeps per-request scratch buffers); the drafters' statistics may be
    shared across requests.
    """

    def __init__(self, drafters: Sequence[Drafter], *, min_score: float = 0.0,
                 tail_len: int = KEY_DEPTH) -> None:
        names = [d.name for d in drafters]
        if len(set(names)) != len(names):
            raise ValueError(f"drafter names must be unique, got {names}")
        if len(names) > 127:
            raise ValueError("at most 127 drafters")
        if not 0.0 <= min_score <= 1.0 or tail_len < 1:
            raise ValueError("need 0 <= min_score <= 1 and tail_len >= 1")
        warm_drafting()  # compile (or load) the kernels now, not mid-request
        self.drafters = tuple(drafters)
        self.source_names = tuple(names)
        self.min_score = float(min_score)
        self.tail_len = int(tail_len)
        self._empty = DraftTree.empty(self.source_names)
        # (index, drafter, propose_into or None, most nodes it writes): the lookups' allocation-free
        # path, looked up once
        self._plan: list[tuple[int, Drafter, Any, int]] = []
        for i, d in enumerate(self.drafters):
            fast = getattr(d, "propose_into", None)
            self._plan.append((i, d, fast, d.node_capacity(1 << 30) if fast is not None else 0))  # type: ignore[attr-defined]
        cap = max(256, sum(p[3] for p in self._plan))
        self._nodes = np.zeros((5, cap), np.int64)  # [5, capacity] candidate nodes of one step
        self._est = np.zeros((2, cap), np.float32)  # [2, capacity] predicted, score
        self._ws = np.empty(8 * cap + 32, np.int64)  # merge scratch
        self._fws = np.empty(2 * cap, np.float32)

    def _room(self, at: int, need: int) -> None:
        if at + need > self._nodes.shape[1]:
            cap = max(at + need, 2 * self._nodes.shape[1])
            nodes = np.zeros((5, cap), np.int64)
            nodes[:, :at] = self._nodes[:, :at]
            est = np.zeros((2, cap), np.float32)
            est[:, :at] = self._est[:, :at]
            self._nodes, self._est = nodes, est

    def _tail(self, tokens: object) -> np.ndarray:
        if isinstance(tokens, np.ndarray):
            tail = tokens[-self.tail_len:]
            if tail.dtype == np.int32 and tail.flags.c_contiguous:
                return tail
            return np.ascontiguousarray(tail, dtype=np.int32)
        return np.array(tokens[-self.tail_len:], np.int32)  # type: ignore[index]

    def compose(self, tokens: object, budget: int, *, chain_only: bool = False) -> DraftTree:
        """The draft tree for the sequence ``tokens`` (the whole context or just its tail; a list or a
        1-D int array): at most ``budget`` nodes, ordered by score. Empty when nothing matches."""
        if budget <= 0:
            return self._empty
        tail = self._tail(tokens)
        rows: list[tuple[int, int, int, int, int, int]] = []
        factors: list[np.ndarray] = []
        at = 0
        for i, d, fast, most in self._plan:
            if fast is not None:
                if at + most > self._nodes.shape[1]:  # only after a large generic candidate
                    self._room(at, most)
                for start, n, L, num, factor in fast(tail, budget, self._nodes, at):
                    rows.append((start, n, L, num, i, 0))
                    factors.append(factor)
                    at = start + n
                continue
            for c in d.propose(tail, budget):
                n = len(c)
                if n == 0:
                    continue
                self._room(at, n)
                self._nodes[0, at:at + n] = c.tokens
                self._nodes[1, at:at + n] = c.parents
                self._est[0, at:at + n] = c.predicted
                self._est[1, at:at + n] = c.score
                rows.append((at, n, c.match_len, 0, i, 1))
                factors.append(_NEUTRAL)  # scored by its drafter already
                at += n
        if not rows:
            return self._empty
        if self._fws.shape[0] < 2 * self._nodes.shape[1]:
            self._ws = np.empty(8 * self._nodes.shape[1] + 32, np.int64)
            self._fws = np.empty(2 * self._nodes.shape[1], np.float32)
        ints, floats = _compose(self._nodes, self._est, np.array(rows, np.int64),
                                _factor_table(factors), int(budget), np.float32(self.min_score),
                                bool(chain_only), np.float32(PROB_CAP), self._ws, self._fws)
        return DraftTree._fast(ints[0], ints[1], ints[2].astype(np.int8), ints[3], floats[0], ints[4],
                               floats[1], self.source_names)

    def observe(self, tree: DraftTree, accepted: Sequence[int] | np.ndarray) -> None:
        """Feed back a verification: ``accepted`` holds the indices of the accepted nodes of ``tree``
        (a path from the root). Every tested node updates its source's statistics."""
        n = len(tree)
        if n == 0:
            return
        idx = np.asarray(accepted, np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"accepted indices must be in [0, {n}), got {idx.tolist()}")
        acc = np.zeros(n, np.bool_)
        acc[idx] = True
        par = tree.parents
        tested = (par < 0) | acc[np.maximum(par, 0)]
        for s, d in enumerate(self.drafters):
            mask = tested & (tree.source == s)
            if mask.any():
                d.observe(tree.match_len[mask], tree.predicted[mask], acc[mask], tree.depth[mask])


_NEUTRAL = np.ones(1, np.float32)


def _factor_table(rows: list[np.ndarray]) -> np.ndarray:
    """[C, D + 1] float32 from per-candidate rows of possibly different widths (a shorter row is
    padded with its last entry, which is what the kernel reads past it anyway)."""
    width = max(len(r) for r in rows)
    if all(len(r) == width for r in rows):
        return np.asarray(rows, np.float32)
    out = np.empty((len(rows), width), np.float32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
        out[i, len(r):] = r[-1]
    return out
