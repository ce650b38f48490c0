"""One sequence's state between engine steps, and the output of a step.

The engine keeps no per-request state of its own: everything a generation needs between steps lives
in a :class:`SequenceState` (the caller holds it), so a scheduler can step any set of sequences
together. Words as defined in ``lookupspec.verify``.

Positions: after the prefill, ``cache_len`` (``L``) positions are in the sequence's KV slot; the
last emitted token, the *root* of the next step, is ``context[L]`` and is not in the cache yet. A
step writes the root and its draft nodes at positions ``L ..``, keeps the root and the accepted path,
and emits the accepted tokens plus one recovered or bonus token, which becomes the next root.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from lookupspec.constraints import TreeMasks
from lookupspec.drafting.base import DraftSession, ProposedTree
from lookupspec.drafting.draft_model import DraftModelDrafter
from lookupspec.drafting.policy import Draft, DraftInputs
from lookupspec.logits import LogitsProcessor, TokenLogprob
from lookupspec.params import GenerationParams, LookupScope, SpecParams
from lookupspec.runtime.prefix_cache import PrefixBlock
from lookupspec.sampling import SamplingParams
from lookupspec.stats import RequestStats

__all__ = ["SequenceState", "StepOutput", "finish_tokens"]


@dataclass(frozen=True)
class StepOutput:
    """Tokens one step emitted. ``finish_reason`` is set on the last step: ``stop`` (EOS or a stop
    token id, which is included in ``tokens``) or ``length`` (max_tokens, the context window, or a
    KV slot that could not grow). ``draft_tokens`` / ``accepted_tokens`` describe this step's
    speculation (0 for a plain step); ``stats`` is the request's running :class:`RequestStats` (the
    same object every step)."""

    tokens: tuple[int, ...]
    finish_reason: str | None = None
    draft_tokens: int = 0
    accepted_tokens: int = 0
    stats: RequestStats | None = None
    # per emitted token when the request asked for log-probabilities (else None)
    logprobs: tuple[TokenLogprob, ...] | None = None
    error: str | None = None  # why a request ended with finish_reason "error" (a grammar dead end)


def finish_tokens(
    new: Sequence[int], generated: int, params: GenerationParams, room: int
) -> tuple[list[int], str | None]:
    """Cut one step's tokens where generation ends. ``generated`` tokens were emitted before this
    step; ``room`` is what the context window still holds. Example: new=[5, 2, 7] with EOS 2 ->
    ([5, 2], "stop"); new=[5, 6] with one token left before max_tokens -> ([5], "length")."""
    ends = params.end_token_ids
    limit = min(params.max_tokens - generated, room)
    out: list[int] = []
    for tok in new:
        if len(out) >= limit:
            return out, "length"
        out.append(int(tok))
        if tok in ends:
            return out, "stop"
    if len(out) >= limit:
        return out, "length"
    return out, None


@dataclass(eq=False)
class SequenceState:
    """A generation in progress. Created by ``Engine.start``, advanced by ``Engine.prefill`` and
    ``Engine.step``, ended by the engine (a finish reason) or ``Engine.release`` (cancelled)."""

    prompt: tuple[int, ...]
    params: GenerationParams
    spec: SpecParams
    sampling: SamplingParams  # with a concrete seed when sampling
    slot: int  # its KV slot in the runner's pool
    scope: LookupScope | None = None  # where it may draft from besides its own context
    session: DraftSession | None = None  # lookup drafting (None: speculation off, or no lookup source)
    draft_model: DraftModelDrafter | None = None
    context: list[int] = field(default_factory=list)  # prompt + every emitted token
    prefilled: int = 0  # prompt tokens in the KV slot
    generated: int = 0  # tokens emitted
    finish_reason: str | None = None
    released: bool = False
    prefill_logits: torch.Tensor | None = None  # [vocab] the prompt's last row, kept for forks
    namespace: str | None = None  # prefix-cache namespace (None: this prompt is not cached)
    prefix_block: PrefixBlock | None = None  # the prefix cache's block of its last whole prefilled chunk
    stats: RequestStats = field(default_factory=RequestStats)
    logits: LogitsProcessor | None = None  # grammar / penalties / bias / min_tokens / logprobs, if asked
    error: str | None = None  # set with finish_reason "error"
    # this step's draft before the grammar pruned it (feedback goes to the drafters in its indices)
    # and the grammar's walk of the pruned one; set by Engine._choose, used once by the step
    unpruned: Draft | None = None
    tree_masks: TreeMasks | None = None

    @property
    def prefill_done(self) -> bool:
        return self.prefilled == len(self.prompt)

    @property
    def running(self) -> bool:
        """Prefilled, not finished, not released: ready for a step."""
        return self.prefill_done and self.generated > 0 and self.finish_reason is None and not self.released

    @property
    def cache_len(self) -> int:
        """``L``: positions in the KV slot (the root, ``context[L]``, is not among them)."""
        return len(self.context) - 1 if self.generated else self.prefilled

    @property
    def root(self) -> int:
        return self.context[-1]

    @property
    def max_draft(self) -> int:
        return self.spec.max_draft_tokens if self.spec.enabled else 0

    def draft_inputs(self) -> DraftInputs:
        grammar = self.logits is not None and self.logits.grammar is not None
        allowed = self._grammar_allows if grammar else None
        return DraftInputs(self.session, self.draft_model, self.spec, self.sampling, self.context, allowed)

    def _grammar_allows(self, tree: ProposedTree) -> Sequence[int]:
        """The nodes of a proposed lookup tree that the output's grammar allows along their paths."""
        assert self.logits is not None
        masks = self.logits.prune([int(t) for t in tree.tokens], [int(p) for p in tree.parents])
        return range(len(tree.tokens)) if masks is None else masks.kept
