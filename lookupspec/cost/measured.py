"""The costs one engine measures: its steps' and its draft model's tokens'.

One :class:`Costs` per engine. The engine writes it (every step's own forward, every forward that
carried a prompt chunk, the warm-up's forwards, and where the static step serves, each bucket's
steps; the drafting policy times each draft-model chain it drafts) and two readers price their
choices with it: the drafting policy (which draft nodes pay for the time they add to the step,
:mod:`lookupspec.cost.draft`) and the scheduler (how many prompt tokens a forward carries,
:mod:`lookupspec.cost.chunk`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .buckets import BucketCosts
from .draft import CostModel
from .step import StepCostModel

__all__ = ["Costs"]


@dataclass
class Costs:
    """``steps``: seconds of a step by shape (batch, rows, contexts); ``draft_token``: seconds per
    draft-model token (a one-size :class:`CostModel`); ``buckets``: seconds per bucket where the
    static step serves the engine's forwards (None elsewhere). All thread-safe."""

    steps: StepCostModel = field(default_factory=StepCostModel)
    draft_token: CostModel = field(default_factory=lambda: CostModel(max_tokens=1))
    buckets: BucketCosts | None = None

    def draft_token_s(self, base: float) -> float:
        """Seconds of one draft-model token; unmeasured, half of ``base`` (a step's seconds)."""
        if self.draft_token.known():
            return float(self.draft_token.table(1)[1])
        return 0.5 * base
