"""The draft budget: how many draft nodes a step verifies, chosen by expected tokens per second.

The cost side of speculation. The engine measures what a forward costs (:mod:`lookupspec.cost.step`
for a whole step; :class:`CostModel` for a per-size table, e.g. a draft-model token) and the
drafting policy supplies each sequence's draft nodes ordered by score, where a node's score
estimates the probability that the whole path to it is accepted (calibrated by observed acceptance,
:mod:`lookupspec.drafting.acceptance`). The expected tokens a step emits with the first ``k`` nodes
is ``1 + sum(score[:k])`` (one recovered or bonus token always comes out). For one sequence
:class:`BudgetPolicy` picks

    k* = argmax_k  (1 + sum(score[:k])) / (target_cost(k + 1) + draft_cost(k))

down to ``k = 0``, plain decoding. Worked example: scores [0.9, 0.8, 0.1], target costs 40, 44, 46,
60 ms for 1..4 tokens: k=0 -> 1/40 = .025, k=1 -> 1.9/44 = .043, k=2 -> 2.7/46 = .059, k=3 ->
2.8/60 = .047: two nodes are drafted.

For a batch, :func:`allocate` applies the same rule to the whole step: a node of sequence ``i`` with
score ``s`` adds ``s`` expected tokens and ``c_i`` seconds, and the nodes are kept in order of
``s / c_i`` while they raise the batch's expected tokens per second (see
:mod:`lookupspec.drafting.policy`).

Because the costs are measured rather than assumed, the same rule switches speculation off where it
does not pay: low-acceptance (creative) text, long contexts where a wide forward costs more, a busy
machine, a large batch, or a draft model too slow for its acceptance rate.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["BudgetPolicy", "CostModel", "allocate", "cap_rows"]


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



def allocate(lists: list[np.ndarray], costs: list[float], base: float, b: int,
             max_rows: int | None,
             bucket: Callable[[int], tuple[int, float | None] | None] | None = None) -> list[int]:
    """How many of each sequence's nodes a step of ``b`` sequences keeps: ``lists[i]`` [m_i] the
    descending scores of sequence i's nodes, ``costs[i]`` the seconds one of its nodes adds, ``base``
    the seconds of the step with no drafts, ``max_rows`` the most rows the step may have (None: no
    limit). The prefix, in order of score / cost, that maximizes (b + kept scores) / (step seconds).

    Step seconds are ``base`` + the kept nodes' costs, unless ``bucket`` says the step runs in fixed
    shapes (:mod:`lookupspec.cost.buckets`): ``bucket(rows)`` is the rows of the bucket a step of
    ``rows`` rows runs in and its measured seconds (None: unmeasured, priced by the linear model at
    the bucket's full size), or None where no bucket holds it. A bucket then costs the same full or
    not, so the best prefix fills its free rows with the next-best nodes."""
    items = [(float(s) / c if c > 0 else float("inf"), float(s), c, i)
             for i, (sc, c) in enumerate(zip(lists, costs, strict=True)) for s in np.clip(sc, 0.0, 1.0)]
    items.sort(key=lambda it: -it[0])  # stable: each sequence's nodes stay in score order
    limit = len(items) if max_rows is None else max(0, min(len(items), max_rows - b))
    cum = np.concatenate(([0.0], np.cumsum([it[2] for it in items])))
    mean = float(cum[-1]) / len(items) if items else 0.0

    def linear(n: int) -> float:  # seconds of a step of n nodes, the costliest priced beyond the list
        return base + float(cum[min(n, len(items))]) + max(0, n - len(items)) * mean

    def seconds(k: int) -> float:
        found = bucket(b + k) if bucket is not None else None
        if found is None:
            return linear(k)
        rows, measured = found
        return measured if measured is not None else linear(max(k, rows - b))

    gain, time_s = float(b), seconds(0)
    best_rate, best_k = (gain / time_s if time_s > 0 else 0.0), 0
    for k, (_, s, _, _) in enumerate(items[:limit], 1):
        gain += s
        time_s = seconds(k)
        if time_s > 0 and gain / time_s > best_rate:
            best_rate, best_k = gain / time_s, k
    keep = [0] * len(lists)
    for _, _, _, i in items[:best_k]:
        keep[i] += 1
    return keep


def cap_rows(keep: list[int], b: int, max_rows: int | None) -> list[int]:
    """Trim the last sequences' node counts so that a step of ``b`` sequences has at most
    ``max_rows`` rows (None: no limit)."""
    if max_rows is None:
        return keep
    room = max(0, max_rows - b)
    out = []
    for k in keep:
        out.append(min(k, room))
        room -= out[-1]
    return out
