"""Adaptivity: choose each step's draft budget by expected tokens per second.

The engine measures, online, what a target forward over ``n`` input tokens costs (the root plus
``n - 1`` draft nodes; it grows with ``n``, and faster on a busy machine than an idle one) and what a
draft-model token costs. The composer supplies the draft nodes ordered by score, where a node's score
estimates the probability that the whole path to it is accepted (calibrated by each source's observed
acceptance per match length). The expected tokens a step emits with the first ``k`` nodes is
``1 + sum(score[:k])`` (one recovered or bonus token always comes out). The policy picks

    k* = argmax_k  (1 + sum(score[:k])) / (target_cost(k + 1) + draft_cost(k))

down to ``k = 0``, plain decoding. Worked example: scores [0.9, 0.8, 0.1], target costs 40, 44, 46,
60 ms for 1..4 tokens: k=0 -> 1/40 = .025, k=1 -> 1.9/44 = .043, k=2 -> 2.7/46 = .059, k=3 ->
2.8/60 = .047: two nodes are drafted.

Because the cost table is measured rather than assumed, the same rule switches speculation off where
it does not pay: low-acceptance (creative) text, long contexts where a wide forward costs more, a busy
machine, or a draft model too slow for its acceptance rate.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["BudgetPolicy", "CostModel", "DraftModelGate", "Exploration", "ScoreCalibration"]


class CostModel:
    """Exponential moving averages of a forward's seconds per input size, interpolated between
    measured sizes. Thread-safe (one instance per engine, shared by its requests)."""

    def __init__(self, max_tokens: int = 256, alpha: float = 0.15) -> None:
        self.max_tokens = max_tokens
        self.alpha = alpha
        self._sum = np.zeros(max_tokens + 1)
        self._seen = np.zeros(max_tokens + 1, dtype=bool)
        self._count = np.zeros(max_tokens + 1)
        self._lock = threading.Lock()

    def observe(self, n: int, seconds: float) -> None:
        if not 1 <= n <= self.max_tokens or seconds <= 0:
            return
        with self._lock:
            if self._seen[n]:
                # a forward slowed down by another process (seen as 10-50x on a shared 2-core box)
                # says nothing about the cost of n tokens: cap how far one sample can pull the mean
                seconds = min(seconds, 2.0 * self._sum[n])
                self._sum[n] += self.alpha * (seconds - self._sum[n])
            else:
                self._sum[n] = seconds
                self._seen[n] = True
            self._count[n] += 1

    def known(self) -> bool:
        return bool(self._seen[1])

    def table(self, upto: int) -> np.ndarray:
        """Estimated seconds for sizes 0..upto (index 0 unused).

        Linear interpolation between measured sizes, flat below the first and proportional growth past
        the last. Once three or more sizes >= 2 are known, a straight line ``a + b * n`` is fitted to
        them (weighted by how often each was measured, capped; sizes over 1.3x the line are refitted
        without and replaced by the line), and no size is estimated above 1.1x the line: a forward's
        cost is close to linear in its width, and this keeps one slow sample at a rarely chosen size
        (which, thought expensive, would never be measured again) from making every larger size look
        expensive for good."""
        upto = min(upto, self.max_tokens)
        with self._lock:
            xs = np.flatnonzero(self._seen)
            ys = self._sum[xs].copy()
            ws = np.minimum(self._count[xs], 50.0)
        out = np.zeros(upto + 1)
        if xs.size == 0:
            return out
        sizes = np.arange(1, upto + 1)
        line = None
        wide = xs >= 2
        if wide.sum() >= 3:
            x, y, w = xs[wide], ys[wide], np.sqrt(ws[wide])
            b, a = np.polyfit(x, y, 1, w=w)
            slow = y > 1.3 * (a + b * x)  # slow outliers: refit without them, then replace them
            if (~slow).sum() >= 3 and slow.any():
                b, a = np.polyfit(x[~slow], y[~slow], 1, w=w[~slow])
            b = max(b, 0.0)
            ys[np.flatnonzero(wide)[slow]] = a + b * x[slow]
            line = a + b * sizes[1:]
        out[1:] = np.interp(sizes, xs, ys)
        last = xs[-1]
        if last < upto:
            # past the largest measured size assume cost grows in proportion to the size: pessimistic,
            # so the policy only widens drafts into sizes it has evidence for or that clearly pay
            out[last + 1 :] = ys[-1] * sizes[last:] / last
        if line is not None:
            out[2:] = np.minimum(out[2:], 1.1 * line)
        # a wider forward never costs less than a narrower one
        out[1:] = np.maximum.accumulate(out[1:])
        return out


class ScoreCalibration:
    """Maps a draft node's path score to the observed chance that it ends up on the accepted path.

    The drafters' scores are products of per-node conditionals, each calibrated by match length and
    depth; their product still comes out too low for the many deep, low-scoring nodes of long copies
    (measured on the bench prompts: nodes scored 0.03 were accepted 7% of the time, 0.14 -> 22%).
    Since the policy's expected gain is the sum of these probabilities, an under-estimate verifies too
    few nodes. This keeps, per score bin ``b`` (center ``c_b``), how many verified nodes were accepted
    (decayed), estimates the bin's acceptance as

        p_b = (accepted_b + prior * c_b) / (verified_b + prior)     # made non-decreasing over bins

    and returns ``calibrated(s) = s * p_b / c_b`` for a score ``s`` in bin ``b`` (capped at 1, then a
    running minimum so that descending input stays descending: the prefix-closed tree order is kept).
    Thread-safe; one per engine, shared by its requests."""

    def __init__(self, bins: int = 20, prior: float = 8.0, decay: float = 0.999) -> None:
        self.bins = bins
        self.prior = prior
        self.decay = decay  # old evidence fades: acceptance drifts with the workload
        self.verified = np.zeros(bins)
        self.accepted = np.zeros(bins)
        self._lock = threading.Lock()
        centers = (np.arange(bins) + 0.5) / bins
        self._ratio = np.ones(bins)  # calibrated / center, per bin
        self._centers = centers

    def _bin(self, scores: np.ndarray) -> np.ndarray:
        return np.minimum((np.clip(scores, 0.0, 1.0) * self.bins).astype(np.int64), self.bins - 1)

    def observe(self, scores: np.ndarray, accepted: np.ndarray) -> None:
        """scores [n] the verified nodes' raw path scores; accepted [n] bool, node on the accepted path."""
        if len(scores) == 0:
            return
        b = self._bin(np.asarray(scores, np.float64))
        with self._lock:
            self.verified *= self.decay
            self.accepted *= self.decay
            np.add.at(self.verified, b, 1.0)
            np.add.at(self.accepted, b, np.asarray(accepted, np.float64))
            cal = (self.accepted + self.prior * self._centers) / (self.verified + self.prior)
            cal = np.maximum.accumulate(np.minimum(cal, 1.0))
            self._ratio = cal / self._centers

    def observe_path(self, scores: np.ndarray, accepted: Sequence[int]) -> None:
        """scores [n] of a verified tree's nodes; accepted: indices of the nodes on the accepted path."""
        on_path = np.zeros(len(scores), dtype=bool)
        on_path[list(accepted)] = True
        self.observe(np.asarray(scores, np.float64), on_path)

    def apply(self, scores: np.ndarray) -> np.ndarray:
        """Calibrated scores [n] (same order as ``scores`` when those are sorted descending)."""
        s = np.asarray(scores, np.float64)
        if s.size == 0:
            return s
        out = np.minimum(s * self._ratio[self._bin(s)], 1.0)
        return np.minimum.accumulate(out)  # descending input stays descending


class Exploration:
    """Verifies the top lookup nodes anyway after ``every`` steps in a row whose non-empty tree the
    policy refused. The scores are calibrated by observed acceptance, and a source that is never
    verified never gets the evidence to recover (a bad first request would switch lookups off for
    good); ``nodes`` extra nodes in a forward cost a few percent of a step on the machines measured.
    One per engine: the count runs across its requests, and across the sequences of a batch, which
    share the calibration: a step explores at most one sequence (``adjust_batch``), so the rows it
    adds do not grow with the batch."""

    def __init__(self, every: int = 8, nodes: int = 2) -> None:
        self.every = every
        self.nodes = nodes
        self._refused = 0
        self._turn = 0  # which of a batch's refused sequences explores next (round robin)

    def adjust_batch(self, keep: Sequence[int], available: Sequence[int]) -> list[int]:
        """Node counts for one step: ``keep[i]`` the policy's choice for sequence i, ``available[i]`` its
        lookup tree's nodes (0 for a sequence with no tree or drafting a draft-model chain). A step
        that verifies some tree resets the count; a step that refuses every non-empty tree counts once,
        and every ``every``-th such step one of them (in turn) verifies ``nodes`` nodes."""
        out = list(keep)
        if any(k for k, a in zip(keep, available, strict=True) if a):
            self._refused = 0
            return out
        refused = [i for i, a in enumerate(available) if a]
        if not refused:
            return out
        self._refused += 1
        if self._refused < self.every:
            return out
        self._refused = 0
        i = refused[self._turn % len(refused)]
        self._turn += 1
        out[i] = min(available[i], self.nodes)
        return out

    def adjust(self, k: int, available: int) -> int:
        """The node count to verify for a step of one sequence, given the policy's choice ``k`` out of
        ``available`` nodes."""
        return self.adjust_batch([k], [available])[0]


@dataclass(frozen=True)
class BudgetPolicy:
    """Picks how many of the (score-ordered) draft nodes to verify."""

    min_score: float = 0.0  # nodes scoring below this are never worth a slot
    adaptive: bool = True  # False: verify every proposed node (a fixed budget, as HF's peers do)

    def choose(self, scores: np.ndarray, target_cost: np.ndarray, draft_cost: float = 0.0) -> int:
        """scores: [m] float, descending path probabilities; target_cost: [>= m + 2] seconds per input
        size (index = tokens in the forward); draft_cost: seconds per drafted node (draft model)."""
        m = int(scores.shape[0])
        if not self.adaptive:
            return m
        if m == 0 or target_cost.shape[0] < 2 or target_cost[1] <= 0:
            return 0
        m = min(m, target_cost.shape[0] - 2)
        s = np.clip(scores[:m], 0.0, 1.0)
        gain = 1.0 + np.concatenate(([0.0], np.cumsum(s)))  # [m + 1]: k = 0..m
        cost = target_cost[1 : m + 2] + draft_cost * np.arange(m + 1)
        rate = gain / cost
        k = int(np.argmax(rate))
        while k > 0 and s[k - 1] < self.min_score:
            k -= 1
        return k


class DraftModelGate:
    """Acceptance history of the draft model per chain position, and whether drafting with it pays.

    ``rates()`` estimates P(position i accepted | position i - 1 accepted) with a Beta(1, 1) prior.
    When the policy keeps choosing zero draft-model tokens the gate closes, but every ``probe_every``
    steps it lets a short chain through so the estimate can recover when the text starts to copy
    (the draft model "switches back on when it would pay")."""

    def __init__(self, max_len: int = 16, probe_every: int = 32, probe_len: int = 2) -> None:
        self.max_len = max_len
        self.probe_every = probe_every
        self.probe_len = probe_len
        self.tried = np.zeros(max_len)
        self.accepted = np.zeros(max_len)
        self.steps_since_use = probe_every  # probe on the first chance: there is no history yet
        self._lock = threading.Lock()

    def rates(self) -> np.ndarray:
        with self._lock:
            return (self.accepted + 1.0) / (self.tried + 2.0)

    def path_scores(self, k: int) -> np.ndarray:
        return np.cumprod(self.rates()[: min(k, self.max_len)])

    def observe(self, drafted: int, accepted: int) -> None:
        with self._lock:
            d = min(drafted, self.max_len)
            a = min(accepted, d)
            self.tried[: min(a + 1, d)] += 1  # positions up to the first rejection were judged
            self.accepted[:a] += 1
            decay = 0.995  # forget slowly: acceptance drifts with the text being written
            self.tried *= decay
            self.accepted *= decay

    def probe_due(self) -> bool:
        return self.steps_since_use >= self.probe_every
