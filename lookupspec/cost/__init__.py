"""The cost of a step and of a draft, in one place.

- :mod:`lookupspec.cost.step`: :class:`StepCostModel`, a step's seconds as a function of its shape,
  fitted online from the engine's measured forwards.
- :mod:`lookupspec.cost.draft`: the draft budget: :class:`BudgetPolicy` (one sequence's nodes),
  :func:`allocate` (a batch's nodes under one threshold), :class:`CostModel` (a per-size table).
- :mod:`lookupspec.cost.chunk`: :class:`ChunkBudget`, the prompt tokens a forward carries while
  sequences decode.
- :mod:`lookupspec.cost.buckets`: :class:`BucketCosts`, a static step's seconds per bucket (CUDA
  graphs run a bucket whole, full or not).
- :mod:`lookupspec.cost.measured`: :class:`Costs`, what one engine measured, which the drafting
  policy and the scheduler both read.
"""

from .buckets import BucketCosts
from .chunk import ChunkBudget
from .draft import BudgetPolicy, CostModel, allocate, cap_rows
from .measured import Costs
from .step import StepCostModel, step_features

__all__ = ["BucketCosts", "BudgetPolicy", "ChunkBudget", "CostModel", "Costs", "StepCostModel", "allocate",
           "cap_rows", "step_features"]
