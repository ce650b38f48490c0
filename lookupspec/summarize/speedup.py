"""The speedup over plain decoding, measured in the job itself against a plain-decoding sample.

The job decodes its first ``plain_sample`` documents a second time with speculation off, each right
after its speculative run, and times both decodes from the first text to the last token (the first
completion token comes from the prefill in both decoders, so a document has ``completion_tokens - 1``
*decode tokens*). The sample gives plain decoding's time per decode token on this machine, in this
run; applied to every decode token of the run, it gives what the run would have taken without
speculation::

    speedup = sum_run(decode_tokens) * (sum_sample(plain_decode_s) / sum_sample(decode_tokens))
              / sum_run(decode_s)

Example: the sample decoded 99 tokens in 3.96 s plain (40 ms per token); the whole run decoded 990
tokens in 16.5 s with speculation -> 990 * 0.040 / 16.5 = 2.40x. When the sample is the whole run
(small jobs), this is the ratio of the same documents' plain and speculative decode times.

Both sides are measured in the same run, so a machine that is slow throughout slows both alike. What
it cannot correct: a plain step costs a little more at a longer context (documents much longer than
the sample's make the figure slightly low), and load that changes while the job runs. The figure is
reported as unreliable, with the evidence, when either shows:

- within the sample: plain decoding does the same work every step, so on a steady machine its step
  times stay near their median; a spread between the 10th and 90th percentile above ``SPREAD_LIMIT``
  times the median means the load varied;
- across the run: a speculative step does a plain step's work and more, but not many times more (a
  draft tree of at most 33 tokens costs ~2.2x a one-token forward on a 2-core CPU; a draft model adds
  its chain's forwards, and the engine switches one off when it does not pay). A document whose mean
  speculative step (``decode_s / steps``) falls outside ``STEP_RATIO`` times the sample's median
  plain step was decoded under another load than the sample (example: a load spike made one
  document's 5 steps take 1.15 s each, against a 35 ms plain step).

With ``--concurrency`` above 1, documents are in flight together and batched into the same decode
steps (by the gateway's scheduler, or the in-process client's). ``sum_run(decode_s)`` is then the
wall time during which any document was decoding (the union of their decode windows,
:func:`decode_wall_time`), so the figure is the job's speedup over decoding its documents one at a time
without speculation: batching's gain and speculation's together. A batched step serves several
documents, so the per-document step bound above is widened by the concurrency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["SPREAD_LIMIT", "STEP_RATIO", "PlainSample", "Speedup", "decode_wall_time", "measure_speedup",
           "step_spread"]

# (p90 - p10) / median of the plain sample's step times above which the figure is called unreliable.
# Plain decoding does the same work every step, so steady load keeps its step times near the median
# (SmolLM2 on a 2-core machine under steady heavy load: 0.04); load that comes and goes on the same
# cores spread them 0.9-7.7 there, in 64-96-step samples.
SPREAD_LIMIT = 0.5
# Bounds of (a document's mean speculative step) / (the sample's median plain step) on a steady machine.
STEP_RATIO = (0.5, 6.0)


@dataclass(frozen=True)
class PlainSample:
    """One document of the job decoded again without speculation."""

    doc_id: str
    decode_tokens: int  # completion tokens after the first
    decode_s: float  # plain decode time: first text to last token
    step_s: tuple[float, ...] = ()  # [n] seconds between consecutive texts of the plain decode

    def __post_init__(self) -> None:
        if self.decode_tokens < 0 or self.decode_s < 0:
            raise ValueError("decode_tokens and decode_s must be >= 0")


@dataclass(frozen=True)
class Speedup:
    speedup: float
    how: str  # the measurement, with its numbers
    unreliable: str | None = None  # why the figure should not be trusted, or None


def step_spread(step_s: Sequence[float]) -> tuple[float, float, float] | None:
    """(p10, median, p90) of step times in seconds; None with fewer than 8 steps (no spread to read)."""
    x = np.asarray(step_s, dtype=np.float64)  # [n]
    x = x[np.isfinite(x) & (x >= 0)]
    if x.size < 8:
        return None
    p10, p50, p90 = np.percentile(x, [10, 50, 90])
    return float(p10), float(p50), float(p90)


def decode_wall_time(windows: Sequence[Sequence[float]]) -> float:
    """Seconds covered by the union of [start, end] windows. Example: [0, 2], [1, 3], [5, 6] -> 4."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted((float(a), float(b)) for a, b in windows):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def measure_speedup(samples: Sequence[PlainSample], decode_tokens: int, decode_s: float,
                    doc_steps: Sequence[tuple[str, float]] = (), spread_limit: float = SPREAD_LIMIT,
                    step_ratio: tuple[float, float] = STEP_RATIO) -> Speedup | None:
    """The module docstring's figure. ``decode_tokens`` / ``decode_s``: sums over every document the
    run decoded with speculation (the sampled ones included); ``doc_steps``: (id, mean speculative
    step in seconds) of those documents. None without a usable sample."""
    plain_tokens = sum(s.decode_tokens for s in samples)
    plain_s = sum(s.decode_s for s in samples)
    if plain_tokens <= 0 or plain_s <= 0 or decode_tokens <= 0 or decode_s <= 0:
        return None
    per_token = plain_s / plain_tokens
    ids = ", ".join(repr(s.doc_id) for s in samples[:3]) + (", ..." if len(samples) > 3 else "")
    how = (f"{len(samples)} document{'s' if len(samples) != 1 else ''} ({ids}) decoded again without "
           f"speculation in this run: {plain_tokens} tokens in {plain_s:.2f} s = {per_token * 1e3:.1f} ms "
           f"per token; this run's {decode_tokens} decode tokens took {decode_s:.2f} s with speculation, "
           f"{decode_tokens * per_token:.2f} s at the plain rate")
    spread = step_spread([t for s in samples for t in s.step_s])
    unreliable = []
    if spread is not None and spread[1] > 0 and (spread[2] - spread[0]) / spread[1] > spread_limit:
        p10, p50, p90 = (v * 1e3 for v in spread)
        unreliable.append(f"plain step times ranged {p10:.1f}-{p90:.1f} ms (10th-90th percentile, median "
                          f"{p50:.1f} ms)")
    plain_step = spread[1] if spread is not None else per_token
    low, high = step_ratio
    odd = [(doc_id, step / plain_step) for doc_id, step in doc_steps
           if plain_step > 0 and not low <= step / plain_step <= high]
    if odd:
        worst = max(odd, key=lambda o: max(o[1], 1 / o[1]) if o[1] > 0 else float("inf"))
        unreliable.append(f"{len(odd)} of {len(doc_steps)} documents' speculative steps took outside "
                          f"{low:g}-{high:g}x a plain step ({worst[0]!r}: {worst[1]:.1f}x)")
    why = None
    if unreliable:
        why = "; ".join(unreliable) + ": the machine's load varied; measure on a quiet machine"
    return Speedup(decode_tokens * per_token / decode_s, how, why)
