"""Step costs for the batched replay: measured step times turned into a fitted
:class:`~lookupspec.cost.StepCostModel`.

Three sources, one result (five coefficients, the model's ``t0 + t_seq B + t_row R + t_kv sum(ctx) +
t_att sum(rows ctx)``; context terms per thousand cached positions):

- measured on the model: ``bench-batch``'s cost section (its ``_cost``: B sequences x rows per
  sequence, configurations interleaved round by round, medians), run at two or more contexts so that
  the context terms can be told apart from the per-sequence and per-row ones;
- a JSON file holding such rows under ``"cost"``: a ``bench-batch --json`` file (one context, not
  recorded) or a batched ``bench-replay --json`` file (rows carry their ``context``);
- coefficients given directly (milliseconds), for tests and what-ifs.

:func:`fit_coefficients` is a relative least-squares fit (each sample weighted by 1 / its time, so a
one-row step is fitted as closely as a 512-row one), non-negative like the engine's online fit. When
every sample has the same context the context terms cannot be identified (``sum(ctx)`` moves with B,
``sum(rows ctx)`` with R): they are left at zero, which reads as "costs as measured, whatever the
context". :func:`cost_model` then builds the ``StepCostModel`` the engine's policy reads.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lookupspec.cost import StepCostModel, step_features

__all__ = ["COEFFICIENTS", "CostFit", "CostSample", "cost_model", "fit_coefficients", "measure_samples",
           "parse_coefficients", "samples_from_json"]

COEFFICIENTS = ("t0", "t_seq", "t_row", "t_kv", "t_att")


@dataclass(frozen=True)
class CostSample:
    """A measured step: ``batch`` sequences of ``rows`` rows each over ``context`` cached positions
    (None: not recorded), ``seconds`` its median time."""

    batch: int
    rows: int
    context: int | None
    seconds: float

    def features(self) -> np.ndarray:  # [5]
        return step_features([self.rows] * self.batch, [self.context or 0] * self.batch)


@dataclass(frozen=True)
class CostFit:
    coefficients: dict[str, float]  # seconds; t_kv and t_att per thousand positions
    contexts: tuple[int, ...]  # the distinct measured contexts (empty: given, or not recorded)
    max_error: float  # largest |fit / measured - 1| over the samples (0 when given)

    @property
    def context_terms(self) -> bool:
        return len(self.contexts) >= 2


def parse_coefficients(text: str) -> CostFit:
    """``"t0=30,t_row=0.4,t_att=0.05"`` (milliseconds; missing terms are 0) -> a fit in seconds."""
    values = dict.fromkeys(COEFFICIENTS, 0.0)
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, ms = item.partition("=")
        if not sep or name.strip() not in values:
            raise ValueError(f"--step-cost items are NAME=MS with NAME in {', '.join(COEFFICIENTS)}; "
                             f"got {item!r}")
        values[name.strip()] = float(ms) / 1000.0
    if min(values.values()) < 0 or values["t0"] + values["t_seq"] <= 0:
        raise ValueError("--step-cost: coefficients must be >= 0 and a one-row step must cost something")
    return CostFit(values, (), 0.0)


def fit_coefficients(samples: Sequence[CostSample]) -> CostFit:
    """Relative non-negative least squares over the samples (see the module docstring)."""
    if len(samples) < 3:
        raise ValueError(f"need at least 3 step-cost samples, got {len(samples)}")
    x = np.stack([s.features() for s in samples])  # [n, 5]
    y = np.array([s.seconds for s in samples])  # [n]
    if (y <= 0).any():
        raise ValueError("step-cost samples must have positive times")
    contexts = tuple(sorted({s.context for s in samples if s.context is not None}))
    active = np.ones(len(COEFFICIENTS), dtype=bool)
    if len(contexts) < 2:
        active[3:] = False  # one context: the context terms are not identified (module docstring)
    xw, yw = x / y[:, None], np.ones_like(y)
    theta = np.zeros(len(COEFFICIENTS))
    for _ in COEFFICIENTS:  # drop a negative coefficient and refit, as StepCostModel does
        idx = np.flatnonzero(active)
        sol = np.linalg.lstsq(xw[:, idx], yw, rcond=None)[0]
        theta = np.zeros(len(COEFFICIENTS))
        theta[idx] = sol
        if (sol >= 0).all():
            break
        active[idx[sol < 0]] = False
    theta = np.maximum(theta, 0.0)
    error = float(np.max(np.abs(x @ theta / y - 1.0)))
    return CostFit(dict(zip(COEFFICIENTS, (float(t) for t in theta), strict=True)), contexts, error)


def cost_model(fit: CostFit) -> StepCostModel:
    """A fitted :class:`StepCostModel` that predicts with ``fit``'s coefficients: it observes the exact
    times of eight step shapes (batch 1 and 4 x rows 1 and 2 x context 0 and 500) whose features span
    all five terms, so its own fit recovers them to its ridge (~0.1% on each coefficient; of the
    designs tried, this small and well-conditioned one came closest) and it is ``known()`` at once."""
    theta = np.array([fit.coefficients[k] for k in COEFFICIENTS])
    model = StepCostModel()
    for b in (1, 4):
        for r in (1, 2):
            for c in (0, 500):
                model.observe([r] * b, [c] * b, float(step_features([r] * b, [c] * b) @ theta))
    return model


def samples_from_json(result: Mapping[str, Any]) -> list[CostSample]:
    """The ``"cost"`` rows (``batch``, ``rows``, ``ms``, optional ``context``) of a ``bench-batch
    --json`` or batched ``bench-replay --json`` result."""
    rows = result.get("cost")
    if not rows:
        raise ValueError("no \"cost\" rows (run `python -m tools bench-batch --sections cost --json FILE`)")
    return [CostSample(int(r["batch"]), int(r["rows"]), r.get("context"), float(r["ms"]) / 1000.0)
            for r in rows]


def measure_samples(engine: Any, tokens: Sequence[int], batch_sizes: Sequence[int], rows: Sequence[int],
                    contexts: Sequence[int], rounds: int) -> list[CostSample]:
    """Step times on ``engine``'s model: every (batch, rows) at each context, over caches holding the
    first ``context`` of ``tokens`` (repeated as needed), with ``bench-batch``'s cost measurement."""
    from tools.batched_decoding import _cost

    samples = []
    for context in contexts:
        ids = list(tokens) * (context // max(len(tokens), 1) + 1)
        opts = argparse.Namespace(batch_sizes=list(batch_sizes), rows=list(rows), context=context,
                                  rounds=rounds)
        samples += [CostSample(r["batch"], r["rows"], context, r["ms"] / 1000.0)
                    for r in _cost(engine, ids, opts)[None]]
    return samples
