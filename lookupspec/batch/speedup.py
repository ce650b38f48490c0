"""Estimates of the speedup over plain decoding, from what a job measured. Estimates, not measurements:
the job never decodes the same documents without speculation.

Vocabulary as in ``lookupspec.verify``: a *step* is one target forward after the prefill, the
*acceptance length* AL is tokens emitted per step (accepted + 1). ``c(n)`` is the cost of a target
forward over ``n`` tokens. The first completion token comes from the prefill in both decoders, so
plain decoding needs ``completion_tokens - 1`` one-token steps after it.

1. **Measured** (in-process, where the engine's cost model gives ``c(1)``)::

       speedup = sum_docs (completion_tokens - 1) * c(1)  /  sum_docs decode_s

   ``decode_s`` is the wall time from a document's first token to its last, so it includes all the
   drafting and bookkeeping overhead speculation adds. Per-token overhead plain decoding would pay too
   (detokenization) is not in ``c(1)``, which makes this estimate slightly low, not high.
   Example: 1000 tokens, c(1) = 20 ms, decode_s = 12 s -> 999 * 0.02 / 12 = 1.67x.

2. **From the acceptance length** (any mode)::

       speedup = AL / (c(1 + d) / c(1)),   d = draft_tokens / steps (the mean draft size)

   i.e. each step emits AL tokens for the price of a ``1 + d``-token forward. Example: AL 1.9, d 2.5,
   c(3.5) / c(1) = 1.15 -> 1.65x. In-process the cost ratio comes from the engine's cost model. Over a
   gateway the costs are fitted from the documents themselves: each has a mean step time
   ``decode_s / steps`` and a mean draft size, and a least-squares line ``c(1 + d) = a + b * d`` gives
   ``c(1) = a``. With too few documents, or a fit that makes no sense (``a <= 0``, ``b < 0``), the cost
   ratio is taken as 1 and the estimate is labelled an upper bound (verification free of charge).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Estimate", "acceptance_estimate", "fit_step_costs", "measured_estimate"]


@dataclass(frozen=True)
class Estimate:
    speedup: float
    how: str  # one line: the formula with its numbers
    upper_bound: bool = False


def measured_estimate(decode_tokens: int, decode_s: float, step_1_s: float) -> Estimate | None:
    """Formula 1. ``decode_tokens``: completion tokens after the first (summed over documents)."""
    if decode_tokens <= 0 or decode_s <= 0 or step_1_s <= 0:
        return None
    plain = decode_tokens * step_1_s
    return Estimate(plain / decode_s, f"plain {decode_tokens} tokens x {step_1_s * 1e3:.2f} ms (1-token "
                    f"step, engine cost model) = {plain:.2f} s vs measured decode {decode_s:.2f} s")


def acceptance_estimate(acceptance_length: float, mean_draft: float, step_1_s: float | None,
                        step_d_s: float | None, source: str) -> Estimate | None:
    """Formula 2. ``step_d_s``: cost of a ``1 + mean_draft``-token step; ``None`` costs: upper bound."""
    if acceptance_length <= 0:
        return None
    if step_1_s is None or step_d_s is None or step_1_s <= 0 or step_d_s <= 0:
        return Estimate(acceptance_length, f"AL {acceptance_length:.2f} / 1 (step costs unknown: "
                        "verification taken as free)", upper_bound=True)
    ratio = max(step_d_s / step_1_s, 1.0)  # a wider forward never costs less (as in CostModel.table)
    return Estimate(acceptance_length / ratio,
                    f"AL {acceptance_length:.2f} / cost ratio {ratio:.3f} (a {1 + mean_draft:.2f}-token step "
                    f"{step_d_s * 1e3:.2f} ms vs a 1-token step {step_1_s * 1e3:.2f} ms, {source})")


def fit_step_costs(step_seconds: Sequence[float], mean_drafts: Sequence[float],
                   min_points: int = 3) -> tuple[float, float] | None:
    """Least-squares ``c(1 + d) = a + b * d`` over documents; ``(a, b)`` or None when unusable.

    step_seconds: [docs] mean seconds per step; mean_drafts: [docs] mean draft tokens per step.
    """
    x = np.asarray(mean_drafts, dtype=np.float64)
    y = np.asarray(step_seconds, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("step_seconds and mean_drafts must be 1-D and of the same length")
    keep = np.isfinite(x) & np.isfinite(y) & (y > 0)
    x, y = x[keep], y[keep]
    if x.size < min_points or float(np.ptp(x)) < 0.5:  # no spread in draft size: no slope to fit
        return None
    b, a = np.polyfit(x, y, 1)
    if a <= 0 or b < 0:
        return None
    return float(a), float(b)
