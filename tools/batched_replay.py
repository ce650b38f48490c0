"""Batched replay: recorded greedy outputs decoded again in lockstep, B at a time, with each step's
draft nodes chosen across the batch, and each step's time estimated by a step-cost model.

``python -m tools bench-replay --batch-sizes ...`` runs this. As in the one-sequence replay
(:mod:`tools.replay`), nothing runs the model: greedy verification accepts the
longest root path of a draft tree that spells the recorded output, so a step's outcome follows from
the tree alone. Here ``B`` prompts decode together under *continuous batching*: when a sequence
emits its last recorded token its slot goes to the next prompt of the file (whose prefill is not
simulated; its first token comes from the prefill, as in the engine), so the batch stays full until
the file runs out and then drains. Each step every live sequence proposes from its own lookup
session (one :class:`~lookupspec.drafting.session.LookupDrafting` per replay, as one engine shares
its statistics across requests), a :class:`BatchPolicy` decides the nodes per sequence, verification
accepts what the output confirms, and the step costs ``StepCostModel.predict(rows, contexts)``
seconds: the model is both the policy's cost model and the simulated clock, so tokens per second
here are estimates of the cost model, not measurements. Drafting time and prefills are not counted.

The policies (``BatchPolicy.parse``):

- ``plain``: no drafts; every step emits one token per sequence (the reference).
- ``joint``: the engine's :meth:`~lookupspec.drafting.policy.DraftPolicy.choose_batch`: one
  threshold across the batch, nodes kept while their expected tokens pay for the time they add to the
  whole step (at B=1 the single-request adaptive rule).
- ``fixed:N``: each sequence verifies its best N nodes whenever its tree has any (the engine with a
  fixed budget, ``max_draft_tokens=N``).
- ``off-above:N``: ``joint`` while at most N sequences are live and plain decoding above, as vLLM's
  ``disable_by_batch_size``; it counts live sequences each step (as vLLM counts running requests), so
  a draining batch speculates again once it is down to N.
- ``oracle``: not a policy but the bound on every lookup policy. Each sequence drafts, as a chain, the
  tokens the copy oracle (:mod:`lookupspec.benchmarks.oracle`) would copy at that step, so every node is
  accepted and no lookup drafter can accept more from the same context. It keeps them all: a node
  sure to be accepted pays whenever its row costs less than the step's time per token, and a row
  (~1-2 ms for SmolLM2 on a 2-core CPU) is a fraction of that at every batch size served. Its tokens/s
  over ``plain``'s is then the most that drafts copied from the context can speed up decoding at that
  batch size, under the same cost model.
- ``hindsight``: each sequence's lookup tree as the drafters propose it (up to its room, 32 nodes),
  cut in hindsight to the path the output accepts, so the drafters learn as with a fixed budget of
  the room. Its gain is the most a better choice among the same proposals could give; the rest of
  the way to ``oracle`` is what the proposals never contain.
- ``stopping``: each sequence's best chain (the top-scored child at every depth, the tree an engine
  without tree attention drafts), cut in hindsight where the output leaves it. It knows how far to
  draft but not which continuation is right beyond the drafters' first choice, so it splits
  ``hindsight``'s gain over ``joint`` into when to stop (up to ``stopping``) and which branch to take
  (the rest).

Worked example: one output ``[7, 5, 6, 9]``, B=1, plain: three steps (5, 6, 9), acceptance length 1;
with a tree that drafts ``5 -> 6`` in the first step: the step accepts both and emits 5, 6 and the
bonus 9: one step, acceptance length 3.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from tools.replay import accepted_path

if TYPE_CHECKING:
    from lookupspec.cost import StepCostModel
    from lookupspec.drafting.policy import Draft
    from lookupspec.drafting.session import LookupDrafting, LookupSession
    from lookupspec.params import SpecParams

__all__ = ["POLICY_KINDS", "BatchPolicy", "BatchReplay", "ReplayItem", "SequenceReplay", "StepRecord",
           "replay_batch"]

POLICY_KINDS = ("plain", "joint", "fixed", "off-above", "oracle", "hindsight", "stopping")
MAX_DRAFT = 32  # the engine's default max_draft_tokens (SpecParams)


@dataclass(frozen=True)
class BatchPolicy:
    """How a replayed step chooses its draft nodes; ``n``: the node count of ``fixed``, the batch
    size of ``off-above`` (see the module docstring)."""

    kind: str
    n: int = 0

    def __post_init__(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise ValueError(f"unknown policy {self.kind!r}; choose from plain, joint, fixed:N, off-above:N, "
                             "oracle, hindsight, stopping")
        if (self.kind in ("fixed", "off-above")) != (self.n >= 1):
            raise ValueError(f"policy {self.kind} takes " + (
                "a positive number, e.g. fixed:4" if self.kind in ("fixed", "off-above") else "no number"))

    @classmethod
    def parse(cls, text: str) -> BatchPolicy:
        """``"joint"`` -> BatchPolicy("joint"); ``"fixed:4"`` -> BatchPolicy("fixed", 4)."""
        kind, _, n = text.strip().partition(":")
        try:
            return cls(kind, int(n) if n else 0)
        except ValueError as exc:
            raise ValueError(f"bad policy {text.strip()!r}: {exc}") from None

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.n}" if self.n else self.kind

    @property
    def adaptive(self) -> bool:
        """Whether the engine's adaptive budget chooses the nodes (else every proposed node is kept)."""
        return self.kind != "fixed"

    def room(self, live: int, room: int) -> int:
        """Most nodes one sequence may verify in a step with ``live`` sequences, given its own
        ``room`` (the engine's cap and what is left of its output)."""
        if self.kind == "plain" or (self.kind == "off-above" and live > self.n):
            return 0
        return min(room, self.n) if self.kind == "fixed" else room


@dataclass(frozen=True)
class ReplayItem:
    """One recorded generation: the rendered prompt's ids and the greedy output (first token included)."""

    kind: str
    prompt: tuple[int, ...]
    output: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.prompt or len(self.output) < 2:
            raise ValueError("a replayed item needs a prompt and at least two output tokens")

    @cached_property
    def ids(self) -> np.ndarray:
        """[len(prompt) + len(output)] the whole sequence (the copy oracle reads it)."""
        return np.asarray([*self.prompt, *self.output], np.int64)


@dataclass(frozen=True)
class StepRecord:
    """One batch step: ``live`` sequences, ``nodes`` draft nodes verified, ``tokens`` emitted, and its
    estimated seconds."""

    live: int
    nodes: int
    tokens: int
    seconds: float


@dataclass
class SequenceReplay:
    """One prompt's share: its decode steps, the tokens they emitted, the draft nodes it verified."""

    steps: int = 0
    tokens: int = 0
    nodes: int = 0


@dataclass
class BatchReplay:
    """The replay of every item at one batch size under one policy."""

    batch: int
    policy: str
    sequences: list[SequenceReplay]  # in item order
    log: list[StepRecord] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.log)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.log)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.log)

    @property
    def tokens_per_s(self) -> float:
        """Aggregate decode tokens per estimated second."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def sequence_steps(self) -> int:
        return sum(r.live for r in self.log)

    @property
    def acceptance_length(self) -> float:
        """Tokens per sequence per step (accepted + 1), over all of the replay's sequence-steps."""
        return self.tokens / self.sequence_steps if self.sequence_steps else 0.0

    @property
    def nodes_per_sequence_step(self) -> float:
        return sum(r.nodes for r in self.log) / self.sequence_steps if self.sequence_steps else 0.0

    @property
    def full_steps(self) -> int:
        """Steps with all ``batch`` slots live (the rest are the drain at the end of the file)."""
        return sum(r.live == self.batch for r in self.log)

    @property
    def full_tokens_per_s(self) -> float:
        """Tokens per estimated second over the full-batch steps only: the steady state of a server
        that always has work, without the drain (where a policy that finishes some sequences sooner
        leaves the rest to run in a smaller, less efficient batch). 0 when no step was full."""
        full = [r for r in self.log if r.live == self.batch]
        seconds = sum(r.seconds for r in full)
        return sum(r.tokens for r in full) / seconds if seconds > 0 else 0.0


@dataclass
class _Live:
    index: int
    item: ReplayItem
    session: LookupSession
    emitted: int = 1  # output tokens emitted so far; the first came from the prefill


def _admit(queue: Iterator[tuple[int, ReplayItem]], live: list[_Live], batch: int, drafting: LookupDrafting,
           spec: SpecParams) -> None:
    """Fill ``live`` up to ``batch`` sequences from ``queue``."""
    while len(live) < batch:
        nxt = next(queue, None)
        if nxt is None:
            return
        index, item = nxt
        session = drafting.session(list(item.prompt), spec, None)
        session.extend(item.output[:1])
        live.append(_Live(index, item, session))


def _oracle_drafts(live: list[_Live], rooms: list[int]) -> list[Draft]:
    """Each sequence's copy-oracle chain: every node will be accepted (``oracle`` in the module
    docstring)."""
    from lookupspec.benchmarks.oracle import copy_length
    from lookupspec.drafting.policy import Draft

    drafts = []
    for s, room in zip(live, rooms, strict=True):
        k = copy_length(s.item.ids, len(s.item.prompt) + s.emitted, room)
        drafts.append(Draft.chain(s.item.output[s.emitted:s.emitted + k], "oracle"))
    return drafts


def _hindsight_drafts(live: list[_Live], rooms: list[int], chain_only: bool = False) -> list[Draft]:
    """Each sequence's proposed lookup tree (its best chain when ``chain_only``) cut to the path its
    output accepts (``hindsight`` and ``stopping`` in the module docstring); the drafters get the
    whole tree's outcome, as after verifying it whole."""
    from lookupspec.drafting.policy import Draft

    drafts = []
    for s, room in zip(live, rooms, strict=True):
        if room <= 0:
            drafts.append(Draft())
            continue
        tree = s.session.propose(room, chain_only=chain_only)
        tokens, parents = [int(t) for t in tree.tokens], [int(p) for p in tree.parents]
        path = accepted_path(tokens, parents, s.item.output[s.emitted:])
        s.session.feedback(tree, path)
        drafts.append(Draft.chain([tokens[i] for i in path], "stopping" if chain_only else "hindsight"))
    return drafts


def replay_batch(items: Sequence[ReplayItem], batch: int, policy: BatchPolicy, costs: StepCostModel,
                 max_draft: int = MAX_DRAFT) -> BatchReplay:
    """Decode every item again, ``batch`` at a time (continuous batching, items in order) under
    ``policy``; ``costs`` (already fitted: ``costs.known()``) prices each step and is the policy's
    cost model. Fresh drafting state per call: nothing learned under another policy carries over."""
    from lookupspec.cost import BudgetPolicy, Costs
    from lookupspec.drafting.policy import DraftInputs, DraftPolicy
    from lookupspec.drafting.session import LookupDrafting
    from lookupspec.params import LOOKUP_SOURCES, SpecParams
    from lookupspec.sampling import SamplingParams

    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if not costs.known():
        raise ValueError("the step-cost model has not been fitted")
    drafting = LookupDrafting()
    # the replay never observes steps: the cost model is also its clock
    chooser = DraftPolicy(BudgetPolicy(adaptive=policy.adaptive), Costs(steps=costs))
    spec = SpecParams(sources=LOOKUP_SOURCES, max_draft_tokens=max_draft)
    greedy = SamplingParams()
    result = BatchReplay(batch, policy.label, [SequenceReplay() for _ in items])
    queue = iter(enumerate(items))
    live: list[_Live] = []
    _admit(queue, live, batch, drafting, spec)
    while live:
        # positions in each cache: prompt + emitted tokens, less the root (not in the cache yet)
        contexts = [len(s.item.prompt) + s.emitted - 1 for s in live]
        rooms = [policy.room(len(live), min(len(s.item.output) - s.emitted - 1, max_draft)) for s in live]
        if policy.kind == "oracle":
            drafts = _oracle_drafts(live, rooms)
        elif policy.kind in ("hindsight", "stopping"):
            drafts = _hindsight_drafts(live, rooms, chain_only=policy.kind == "stopping")
        else:
            inputs = [DraftInputs(s.session, None, spec, greedy, s.session.tokens) for s in live]
            drafts = chooser.choose_batch(inputs, rooms, contexts)
        tokens = 0
        for s, draft in zip(live, drafts, strict=True):
            output = s.item.output
            path = accepted_path(draft.tokens, draft.parents, output[s.emitted:])
            chooser.observe(s.session, draft, path)
            emit = min(len(path) + 1, len(output) - s.emitted)
            s.session.extend(output[s.emitted:s.emitted + emit])
            s.emitted += emit
            tokens += emit
            mine = result.sequences[s.index]
            mine.steps += 1
            mine.tokens += emit
            mine.nodes += len(draft)
        seconds = costs.predict([len(d) + 1 for d in drafts], contexts)
        result.log.append(StepRecord(len(live), sum(len(d) for d in drafts), tokens, seconds))
        live = [s for s in live if s.emitted < len(s.item.output)]
        _admit(queue, live, batch, drafting, spec)
    return result
