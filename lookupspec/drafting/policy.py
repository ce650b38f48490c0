"""The drafting policy: what every sequence of a step drafts, chosen jointly from measured costs.

:class:`DraftPolicy` reads the engine's measured costs (:class:`~lookupspec.cost.Costs`: the
batch-aware step cost model and the cost of a draft-model token, which the scheduler reads too) and
owns the acceptance learning (:mod:`lookupspec.drafting.acceptance`: the calibration of path scores
against observed acceptance, the draft model's gate and exploration). Each step it turns every
sequence's lookup tree (or draft-model chain) into one :class:`Draft`:

1. Each sequence proposes its candidates: the score-ordered nodes of its lookup tree, or a draft-model
   chain when that promises a better rate for it (or a periodic probe of a closed gate is due). A
   sequence whose output follows a grammar keeps only the nodes the grammar allows along their paths
   (:attr:`DraftInputs.allowed`), before the budget: a forbidden node could never be accepted, so it
   takes no row of the budget and, never verified, is not counted as rejected by the calibration.
2. The batch keeps the draft nodes whose expected tokens pay for the time they add to the *whole*
   step. A node of sequence ``i`` with calibrated path score ``s`` adds ``s`` expected tokens and
   ``c_i = t_row + t_att * ctx_i`` seconds (its row through the model and its attention over its own
   cache; plus the draft model's time for a chain node). Taking nodes in order of ``s / c_i`` (which
   keeps every sequence's nodes in score order, so each sequence's kept nodes form a tree), the policy
   keeps the prefix ``K`` that maximizes the batch's expected tokens per second
   (:func:`lookupspec.cost.allocate`)::

       K* = argmax_K  (B + sum of the first K scores) / (T(no drafts) + sum of their costs)

   One threshold for all sequences: a node is kept while its ``s / c_i`` beats the batch's current
   rate. With one sequence this is the single-request rule (``k* = argmax (1 + sum s[:k]) / T(1 + k)``).
   In a forward that also carries a prompt chunk (``shared``) ``c_i`` is at least what a chunk token
   costs there: such a forward is compute-bound, and a row is no longer nearly free.
   As the batch grows, its rate ``B / T`` grows (a step's weights are read once for all rows) while a
   node's cost does not shrink, so trees shrink by themselves, down to plain decoding: there is no
   batch-size switch.
3. After verification, :meth:`DraftPolicy.observe` feeds each outcome back to the sequence's lookup
   session, the calibration and the gate; the engine feeds the step's time to the cost model.

The policy sees sequences through :class:`DraftInputs` only, so the engine's state can change
without touching it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from lookupspec.cost import BudgetPolicy, Costs, allocate, cap_rows
from lookupspec.params import SpecParams
from lookupspec.sampling import SamplingParams

from .acceptance import DraftModelGate, Exploration, ScoreCalibration
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
    # the nodes of a proposed lookup tree the sequence could accept at all (its output's grammar),
    # as indices; None: every node. Applied before the budget, which then spends rows on them only.
    allowed: Callable[[ProposedTree], Sequence[int]] | None = None


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

    @classmethod
    def chain(cls, tokens: Sequence[int], source: str, probs: torch.Tensor | None = None,
              draft_s: float = 0.0) -> Draft:
        """A chain of ``tokens`` (each node the child of the one before), all from ``source``."""
        n = len(tokens)
        return cls([int(t) for t in tokens], list(range(-1, n - 1)), [source] * n, probs, draft_s)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @property
    def from_draft_model(self) -> bool:
        return bool(self.sources) and self.sources[0] == "draft_model"


class DraftPolicy:
    """Chooses drafts by expected tokens per second; one per engine, shared by its sequences.
    ``costs``: the engine's measured costs (None: a fresh :class:`~lookupspec.cost.Costs`)."""

    def __init__(self, budget: BudgetPolicy | None = None, costs: Costs | None = None) -> None:
        self.budget = budget or BudgetPolicy()
        self.costs = costs if costs is not None else Costs()
        self.gate = DraftModelGate()
        self.calibration = ScoreCalibration()  # lookup path scores -> observed acceptance
        self.exploration = Exploration()  # verify refused lookup trees now and then
        self.kept_nodes = 0  # nodes the last choose_batch kept (all sequences)

    def choose(self, seq: DraftInputs, max_nodes: int, context: int) -> Draft:
        """The draft of a one-sequence step (``context``: positions in its cache)."""
        return self.choose_batch([seq], [max_nodes], [context])[0]

    def choose_batch(self, seqs: Sequence[DraftInputs], rooms: Sequence[int], contexts: Sequence[int],
                     max_rows: int | None = None, shared: bool = False) -> list[Draft]:
        """One draft per sequence. ``rooms[i]``: most nodes sequence i may verify (its budget and its
        room in max_tokens and the window); ``contexts[i]``: positions in its cache; ``max_rows``:
        most rows the step may have (None: no limit); ``shared``: the forward also carries a prompt
        chunk (a node costs at least a chunk token, see :mod:`lookupspec.cost.step`)."""
        t0 = time.perf_counter()
        b = len(seqs)
        known = self.costs.steps.known()
        adaptive = self.budget.adaptive
        trees: list[ProposedTree | None] = [None] * b
        scores: list[np.ndarray] = [np.empty(0)] * b
        for i, (seq, room) in enumerate(zip(seqs, rooms, strict=True)):
            if seq.session is not None and room > 0:
                tree = seq.session.propose(room, chain_only=not seq.spec.tree)
                if seq.allowed is not None and len(tree.tokens):
                    keep = seq.allowed(tree)
                    if len(keep) < len(tree.tokens):
                        tree = tree.select(keep)
                trees[i] = tree
                scores[i] = self.calibration.apply(np.asarray(tree.score, dtype=np.float64))[:room]
        costs = [self.costs.steps.node_cost(c, shared) for c in contexts] if known else [0.0] * b
        base = self.costs.steps.predict([1] * b, contexts) if known else 0.0
        chains = [self._chain_length(seqs[i], rooms[i], scores[i], contexts[i], costs[i]) for i in range(b)]
        per_token = self.costs.draft_token_s(base)
        if known and adaptive:
            lists = [np.asarray(self.gate.path_scores(k)) if k else scores[i] for i, k in enumerate(chains)]
            node_costs = [costs[i] + (per_token if chains[i] else 0.0) for i in range(b)]
            # a static step runs in a bucket, priced whole; not where prompt chunks share the forward
            # (their rows choose the bucket, and a node there costs a chunk token)
            buckets = None if shared else self.costs.buckets
            keep = allocate(lists, node_costs, base, b, max_rows,
                            None if buckets is None else buckets.lookup_rows(b))
        else:  # no cost measured yet, or a fixed budget: verify what was proposed
            keep = [k if k else len(scores[i]) for i, k in enumerate(chains)]
            keep = cap_rows(keep, b, max_rows)
        ks = self.exploration.adjust_batch(keep, [0 if chains[i] else len(scores[i]) for i in range(b)])
        ks = cap_rows(ks, b, max_rows)
        draft_s = (time.perf_counter() - t0) / max(b, 1)
        drafts = []
        for i, k in enumerate(ks):
            dm = seqs[i].draft_model
            if dm is not None and not chains[i] and rooms[i] > 0:
                self.gate.steps_since_use += 1  # the gate was asked and stayed closed
            if chains[i] and k:
                assert dm is not None
                drafts.append(self._chain(dm, seqs[i], k, draft_s))
                continue
            proposed = None if chains[i] else trees[i]
            if proposed is None or k == 0:
                drafts.append(Draft(draft_s=draft_s, tree=proposed))
                continue
            sub = proposed.prefix(k)
            drafts.append(Draft([int(t) for t in sub.tokens], [int(p) for p in sub.parents],
                                [sub.source_names[int(s)] for s in sub.source], draft_s=draft_s, tree=sub))
        self.kept_nodes = sum(len(d) for d in drafts)
        return drafts

    def _chain_length(self, seq: DraftInputs, room: int, scores: np.ndarray, context: int,
                      cost: float) -> int:
        """The draft-model chain this sequence should draft instead of its lookup tree (0: none):
        when the chain's expected rate for this sequence beats its lookup tree's, or the gate's probe
        is due and the lookups offer nothing."""
        dm = seq.draft_model
        if dm is None or room <= 0:
            return 0
        if not self.budget.adaptive:
            return min(room, self.gate.max_len) if not len(scores) else 0
        if not self.costs.steps.known():
            return 0
        one = self.costs.steps.predict([1], [context])
        per_token = self.costs.draft_token_s(one)
        dm_scores = self.gate.path_scores(min(room, self.gate.max_len))
        table = one + cost * np.arange(len(dm_scores) + 2)
        k = self.budget.choose(dm_scores, np.concatenate(([0.0], table)), per_token)
        rate = (1.0 + float(dm_scores[:k].sum())) / (one + k * (cost + per_token)) if k else 0.0
        lookup_table = np.concatenate(([0.0], one + cost * np.arange(len(scores) + 2)))
        lookup_k = self.budget.choose(scores, lookup_table)
        if lookup_k:
            best_other = (1.0 + float(scores[:lookup_k].sum())) / (one + lookup_k * cost)
        else:
            best_other = 1.0 / one
        if not (k and rate > best_other) and lookup_k == 0 and self.gate.probe_due():
            return min(self.gate.probe_len, room)  # explore: acceptance may have changed
        return k if k and rate > best_other else 0

    def _chain(self, dm: DraftModelDrafter, seq: DraftInputs, k: int, draft_s: float) -> Draft:
        chain = dm.propose(seq.context, k, seq.sampling, sample=not seq.sampling.greedy)
        self.gate.steps_since_use = 0
        self.costs.draft_token.observe(1, chain.seconds / max(len(chain.tokens), 1))
        return Draft.chain(chain.tokens, "draft_model", chain.probs, draft_s + chain.seconds)

    def observe(self, session: DraftSession | None, draft: Draft, accepted: Sequence[int]) -> None:
        """Feed back one verified draft: ``accepted`` holds the indices of its accepted nodes. A tree
        the policy refused whole was not verified: it says nothing about its sources (counting its
        roots as rejected would lower their scores with no evidence, and refuse them more)."""
        n = len(draft)
        if n and draft.tree is not None and session is not None:
            session.feedback(draft.tree, accepted)
            if len(draft.tree.score) == n:
                self.calibration.observe_path(np.asarray(draft.tree.score), accepted)
        if n and draft.from_draft_model:
            self.gate.observe(n, len(accepted))
