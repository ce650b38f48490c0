"""The drafting policy: what each sequence drafts this step, chosen from measured costs.

:class:`DraftPolicy` owns the engine-wide adaptive state of :mod:`lookupspec.adaptive` (the cost of a
target forward per input size, the cost of a draft-model token, the calibration of path scores
against observed acceptance, the draft model's gate, exploration) and turns a sequence's lookup tree
and draft model into one :class:`Draft` per step:

- the prefix of the score-ordered lookup tree that maximizes expected tokens per second
  (``BudgetPolicy.choose``; possibly none: plain decoding);
- or a draft-model chain, when its expected rate beats the lookup tree's (or a periodic probe of a
  closed gate is due);
- or nothing.

After verification, :meth:`DraftPolicy.observe` feeds the outcome back to the sequence's lookup
session, the calibration and the gate. The policy sees sequences through :class:`DraftInputs` only,
so the engine's state can change without touching it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from lookupspec.adaptive import BudgetPolicy, CostModel, DraftModelGate, Exploration, ScoreCalibration
from lookupspec.params import SpecParams
from lookupspec.sampling import SamplingParams

from .base import DraftSession, ProposedTree
from .draft_model import DraftModelDrafter

__all__ = ["Draft", "DraftInputs", "DraftPolicy"]


@dataclass(frozen=True)
class DraftInputs:
    """What the policy reads of one sequence."""

    session: DraftSession | None  # its lookup drafting (None: no lookup source)
    draft_model: DraftModelDrafter | None  # its draft-model drafter (None: no draft model)
    spec: SpecParams
    sampling: SamplingParams
    context: Sequence[int]  # prompt + emitted tokens


@dataclass
class Draft:
    """One step's draft for one sequence: tokens [n], parents [n] (-1 = child of the root), the
    source of each node; ``probs`` [n, vocab] for a sampled draft-model chain (rejection sampling)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    probs: torch.Tensor | None = None
    draft_s: float = 0.0
    tree: ProposedTree | None = None  # the lookup tree verified (for feedback), if any

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @property
    def from_draft_model(self) -> bool:
        return bool(self.sources) and self.sources[0] == "draft_model"


class DraftPolicy:
    """Chooses drafts by expected tokens per second; one per engine, shared by its sequences."""

    def __init__(self, budget: BudgetPolicy | None = None) -> None:
        self.budget = budget or BudgetPolicy()
        self.cost = CostModel()  # seconds of a target forward per input size
        self.draft_cost = CostModel(max_tokens=1)  # seconds per draft-model token (size 1)
        self.gate = DraftModelGate()
        self.calibration = ScoreCalibration()  # lookup path scores -> observed acceptance
        self.exploration = Exploration()  # verify refused lookup trees now and then

    def choose(self, seq: DraftInputs, max_nodes: int) -> Draft:
        """The draft for this step: the best-paying prefix of the lookup tree, a draft-model chain,
        or nothing. ``max_nodes``: most nodes the sequence may verify (its budget and its room)."""
        t0 = time.perf_counter()
        costs = self.cost.table(max_nodes + 2)
        lookup_k, lookup_rate, tree = 0, 0.0, None
        if seq.session is not None and max_nodes > 0:
            tree = seq.session.propose(max_nodes, chain_only=not seq.spec.tree)
            scores = self.calibration.apply(np.asarray(tree.score, dtype=np.float64))
            known = self.cost.known() or not self.budget.adaptive
            lookup_k = self.budget.choose(scores, costs) if known else min(len(scores), max_nodes)
            lookup_k = self.exploration.adjust(lookup_k, len(scores))
            if lookup_k and costs[lookup_k + 1] > 0:
                lookup_rate = (1.0 + float(scores[:lookup_k].sum())) / costs[lookup_k + 1]
        draft_s = time.perf_counter() - t0
        dm = seq.draft_model
        if dm is not None and max_nodes > 0 and not self.budget.adaptive and lookup_k == 0:
            return self._chain(dm, seq, min(max_nodes, self.gate.max_len), draft_s)
        if dm is not None and max_nodes > 0 and self.cost.known():
            dm_scores = self.gate.path_scores(min(max_nodes, self.gate.max_len))
            per_token = self.draft_cost.table(1)[1] if self.draft_cost.known() else costs[1] * 0.5
            k = self.budget.choose(dm_scores, costs, per_token)
            rate = (1.0 + float(dm_scores[:k].sum())) / (costs[k + 1] + k * per_token) if k else 0.0
            best_other = lookup_rate if lookup_k else (1.0 / costs[1] if costs[1] > 0 else 0.0)
            if not (k and rate > best_other) and lookup_k == 0 and self.gate.probe_due():
                k = min(self.gate.probe_len, max_nodes)  # explore: acceptance may have changed
                rate = best_other + 1.0
            if k and rate > best_other:
                return self._chain(dm, seq, k, draft_s)
            self.gate.steps_since_use += 1
        if tree is None or lookup_k == 0:
            return Draft(draft_s=draft_s, tree=tree)
        sub = tree.prefix(lookup_k)
        return Draft([int(t) for t in sub.tokens], [int(p) for p in sub.parents],
                     [sub.source_names[int(s)] for s in sub.source], draft_s=draft_s, tree=sub)

    def _chain(self, dm: DraftModelDrafter, seq: DraftInputs, k: int, draft_s: float) -> Draft:
        chain = dm.propose(seq.context, k, seq.sampling, sample=not seq.sampling.greedy)
        self.gate.steps_since_use = 0
        self.draft_cost.observe(1, chain.seconds / max(len(chain.tokens), 1))
        n = len(chain.tokens)
        return Draft(chain.tokens, list(range(-1, n - 1)), ["draft_model"] * n, chain.probs,
                     draft_s + chain.seconds)

    def observe(self, session: DraftSession | None, draft: Draft, accepted: Sequence[int]) -> None:
        """Feed back one verified draft: ``accepted`` holds the indices of its accepted nodes."""
        n = len(draft)
        if draft.tree is not None and session is not None:
            session.feedback(draft.tree, accepted)
            if n and len(draft.tree.score) == n:  # the verified tree (not one refused whole)
                self.calibration.observe_path(np.asarray(draft.tree.score), accepted)
        if n and draft.from_draft_model:
            self.gate.observe(n, len(accepted))

    def observe_step(self, rows: int, seconds: float) -> None:
        """The measured time of a one-sequence step over ``rows`` input rows (root + draft nodes)."""
        self.cost.observe(rows, seconds)
