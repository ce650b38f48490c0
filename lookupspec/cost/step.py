"""What a step costs, for a whole batch: fitted online from the steps the engine runs.

A step runs one forward over ``R`` rows of ``B`` sequences whose caches hold ``ctx_i`` positions and
which add ``r_i`` rows each (root + draft nodes). On the machines measured (see the README's
``bench-batch`` table) its time is close to linear in four terms::

    T = t0 + t_seq * B + t_row * R + t_kv * sum(ctx_i) + t_att * sum(r_i * ctx_i)

``t0``: reading the weights once (a one-token forward is memory-bound); ``t_seq``: the per-sequence
work that does not depend on its length (an attention call per layer, bookkeeping, verification);
``t_row``: a row through every linear layer and the LM head; ``t_kv``: reading a sequence's keys and
values; ``t_att``: a row's attention over its cache. :class:`StepCostModel` fits the five
coefficients by exponentially forgotten least squares (a coefficient that comes out negative is
dropped and the rest refitted, so every marginal cost is >= 0), caps a sample at twice the current
prediction (a step slowed 10-50x by another process on a shared machine says nothing about shapes)
and is seeded by the engine's warm-up. Thread-safe.

The drafting policy asks it two things: the time of the step with no drafts, and the marginal time
of one more draft node of sequence ``i``: ``t_row + t_att * ctx_i`` (its row through the model and
its attention over its own cache).

A forward that also carries a prompt chunk is another regime. The fit above comes from steps of their
own, which on a CPU mostly read the weights, so a few more rows cost little (``t_row``); a forward
with a chunk of ~100 prompt tokens is compute-bound, and there a draft row costs what a prompt token
costs. The model keeps that price apart (:meth:`StepCostModel.observe_chunk`: what forwards with a
chunk cost beyond their step's estimate, per chunk token, exponentially averaged), and
``node_cost(ctx, shared=True)`` is the larger of the two, so a node in such a forward must pay for
its real time. The scheduler's chunk budget (:mod:`lookupspec.cost.chunk`) sizes prompt chunks
from the same price.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

__all__ = ["StepCostModel", "capped_average", "step_features"]

_N = 5


def step_features(rows: Sequence[int], contexts: Sequence[int]) -> np.ndarray:
    """[1, B, R, sum(ctx), sum(rows * ctx)] for a step: rows[i] rows of sequence i over a cache of
    contexts[i] positions. Context terms are in thousands of positions (keeps the fit conditioned)."""
    r = np.asarray(rows, dtype=np.float64)
    c = np.asarray(contexts, dtype=np.float64) / 1000.0
    return np.array([1.0, float(len(r)), float(r.sum()), float(c.sum()), float((r * c).sum())])


def capped_average(old: float | None, sample: float, memory: float) -> float:
    """An exponential average's next value: ``memory`` on the past, a sample over three times the
    average capped there (another process slowed what was timed); the first sample as it is."""
    if old is None:
        return sample
    return memory * old + (1 - memory) * min(sample, 3 * old)


class StepCostModel:
    """Seconds of a step as a function of its shape (see the module docstring)."""

    def __init__(self, forget: float = 0.995, ridge: float = 1e-6, memory: float = 0.7) -> None:
        self.forget = forget
        self.ridge = ridge
        self.memory = memory  # the chunk-token average's weight on the past
        self.chunk_row_s: float | None = None  # seconds per row in a forward carrying a prompt chunk
        self._a = np.zeros((_N, _N))
        self._b = np.zeros(_N)
        self._count = 0
        self._theta = np.zeros(_N)
        self._lock = threading.Lock()

    def known(self) -> bool:
        return self._count >= _N

    @property
    def coefficients(self) -> dict[str, float]:
        """t0, t_seq, t_row (seconds), t_kv, t_att (seconds per thousand positions)."""
        with self._lock:
            theta = self._theta.copy()
        return dict(zip(("t0", "t_seq", "t_row", "t_kv", "t_att"), (float(x) for x in theta), strict=True))

    def observe(self, rows: Sequence[int], contexts: Sequence[int], seconds: float) -> None:
        if not rows or seconds <= 0:
            return
        x = step_features(rows, contexts)
        with self._lock:
            if self.known():
                seconds = min(seconds, 2.0 * max(float(x @ self._theta), 1e-6))
            self._a = self.forget * self._a + np.outer(x, x)
            self._b = self.forget * self._b + x * seconds
            self._count += 1
            self._theta = self._solve()

    def observe_chunk(self, tokens: int, seconds: float) -> None:
        """A forward carried ``tokens`` prompt tokens that cost ``seconds`` beyond its step's estimate.
        A sample over three times the average (another process slowed the forward) is capped."""
        if tokens <= 0 or seconds <= 0:
            return
        with self._lock:
            self.chunk_row_s = capped_average(self.chunk_row_s, seconds / tokens, self.memory)

    def _solve(self) -> np.ndarray:
        """Least squares with every coefficient >= 0: drop negative ones and refit (5 unknowns)."""
        active = np.ones(_N, dtype=bool)
        theta = np.zeros(_N)
        scale = max(float(np.trace(self._a)) / _N, 1e-12)
        for _ in range(_N):
            idx = np.flatnonzero(active)
            a = self._a[np.ix_(idx, idx)] + self.ridge * scale * np.eye(len(idx))
            try:
                sol = np.linalg.solve(a, self._b[idx])
            except np.linalg.LinAlgError:
                sol = np.linalg.lstsq(a, self._b[idx], rcond=None)[0]
            theta = np.zeros(_N)
            theta[idx] = sol
            if (sol >= 0).all():
                break
            active[idx[sol < 0]] = False
        return np.maximum(theta, 0.0)

    def predict(self, rows: Sequence[int], contexts: Sequence[int]) -> float:
        with self._lock:
            return float(step_features(rows, contexts) @ self._theta)

    def node_cost(self, context: int, shared: bool = False) -> float:
        """Marginal seconds of one more draft node in a sequence whose cache holds ``context``;
        ``shared``: in a forward that also carries a prompt chunk (at least a chunk token's cost)."""
        with self._lock:
            cost = float(self._theta[2] + self._theta[4] * context / 1000.0)
            if shared and self.chunk_row_s is not None:
                cost = max(cost, self.chunk_row_s)
            return cost

    def table(self, upto: int, context: int) -> np.ndarray:
        """Seconds of a one-sequence step over 1..upto rows at ``context`` cached positions (index 0
        unused): the per-size view the single-request tools (bench-replay, summarize) report."""
        out = np.zeros(upto + 1)
        for n in range(1, upto + 1):
            out[n] = self.predict([n], [context])
        return out
