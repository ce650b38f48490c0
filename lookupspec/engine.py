"""The decode loop: prefill, then steps of draft -> one target forward -> verify -> KV bookkeeping.

The engine knows only token ids: tokenizers, chat templates, stop strings, HTTP and Redis live outside
it. ``Engine.generate(prompt_ids, params, spec, scope)`` yields one :class:`StepOutput` per target
forward with the tokens that forward produced (words as defined in ``lookupspec.verify``):

1. Prefill the prompt; choose the first token from its last row.
2. Each step, the *root* is the last emitted token (not yet in the KV cache, at position ``L`` =
   cache length). The composer proposes a draft tree from the context, corpus and output lookups;
   the adaptive policy keeps the prefix of its score-ordered nodes that maximizes expected tokens per
   second (possibly none); if a draft-model chain promises more, that chain is drafted instead.
3. One target forward over ``[root] + draft nodes`` (chains use the causal mask; trees a tree mask with
   per-node positions ``L + depth``), verification walks the tree, and the KV entries of rejected
   nodes are dropped by compacting the root and the accepted path to ``[L, L + 1 + accepted)``.
4. The accepted tokens and the recovered/bonus token are cut at EOS / stop ids / max_tokens exactly
   as the plain loop would cut them, emitted, and appended to the request's context store.

Greedy steps emit the same tokens as plain greedy decoding; seeded sampling with deterministic drafts
(sample-and-match) emits the same tokens as plain seeded sampling, because every token is chosen by
``select_tokens`` with noise keyed by its absolute position.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lookupspec import kernels
from lookupspec.adaptive import BudgetPolicy, CostModel, DraftModelGate, Exploration, ScoreCalibration
from lookupspec.cpu_attention import use_gqa_sdpa
from lookupspec.kvcache import KVCache
from lookupspec.lean_forward import LeanForward
from lookupspec.params import GenerationParams, LookupScope, SpecParams
from lookupspec.sampling import SamplingParams, select_tokens
from lookupspec.stats import AggregateStats, RequestStats
from lookupspec.verify import VerifyResult

__all__ = ["Engine", "StepOutput", "finish_tokens"]


@dataclass(frozen=True)
class StepOutput:
    """Tokens one step emitted. ``finish_reason`` is set on the last step: ``stop`` (EOS or a stop
    token id, which is included in ``tokens``) or ``length`` (max_tokens or the context window).
    ``draft_tokens`` / ``accepted_tokens`` describe this step's speculation (0 for a plain step);
    ``stats`` is the request's running :class:`RequestStats` (the same object every step)."""

    tokens: tuple[int, ...]
    finish_reason: str | None = None
    draft_tokens: int = 0
    accepted_tokens: int = 0
    stats: RequestStats | None = None


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


@dataclass
class _Draft:
    """One step's draft: tokens [n], parents [n] (-1 = child of the root), the source of each node."""

    tokens: list[int]
    parents: list[int]
    sources: list[str]
    probs: torch.Tensor | None = None  # [n, vocab] for a sampled draft-model chain
    draft_s: float = 0.0
    tree: Any = None  # the composer's DraftTree, for acceptance feedback

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))


_EMPTY = _Draft([], [], [])


class Engine:
    """Speculative decoding over a Hugging Face causal LM (and optionally a draft model).

    A model on transformers' ``sdpa`` attention is switched to :mod:`lookupspec.cpu_attention`'s
    grouped-query variant (bit-identical output; draft-tree forwards skip a copy of the KV cache).
    Forwards over a filled cache (decode and verification) of a Llama-shaped float32 CPU model run
    through :class:`~lookupspec.lean_forward.LeanForward` (bit-identical, less Python per step);
    ``lean=False`` keeps transformers' forward for every step."""

    def __init__(self, model: Any, *, draft_model: Any | None = None, context_window: int | None = None,
                 spec: SpecParams | None = None, lookup: Any | None = None,
                 policy: BudgetPolicy | None = None, lean: bool = True) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        use_gqa_sdpa(model)
        if draft_model is not None:
            use_gqa_sdpa(draft_model)
        self.lean = LeanForward.for_model(model) if lean else None
        cfg = model.config
        self.vocab_size = int(cfg.vocab_size)
        window = context_window or getattr(cfg, "max_position_embeddings", None) or 2048
        self.context_window = int(window)
        self.draft_model = draft_model
        self.default_spec = spec or SpecParams()
        if lookup is None:
            from lookupspec.drafting.factory import LookupDrafting

            lookup = LookupDrafting()
        self.lookup = lookup
        self.cost = CostModel()
        self.draft_cost = CostModel(max_tokens=1)  # seconds per draft-model token (size 1)
        self.policy = policy or BudgetPolicy()
        self.gate = DraftModelGate()
        self.calibration = ScoreCalibration()  # lookup path scores -> observed acceptance
        self.aggregate = AggregateStats()
        self.dtype = next(model.parameters()).dtype
        self.exploration = Exploration()  # verify refused lookup trees now and then

    # ------------------------------------------------------------------------------------ forwards

    @torch.inference_mode()
    def _forward(self, input_ids: torch.Tensor, cache: Any, logits_to_keep: int = 1,
                 attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids: [1, n] -> logits [logits_to_keep or n, vocab] (float32)."""
        if self.lean is not None and cache.length > 0:
            return self.lean(input_ids, cache, attention_mask=attention_mask, position_ids=position_ids,
                             logits_to_keep=logits_to_keep).float()
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True,
                         logits_to_keep=logits_to_keep, attention_mask=attention_mask,
                         position_ids=position_ids)
        return out.logits[0].float()

    def new_cache(self, capacity: int = 512) -> KVCache:
        return KVCache.for_model(self.model, capacity=capacity)

    def warmup(self, sizes: Sequence[int] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32), context: int = 64) -> None:
        """Seed the cost model with measured forward times on a dummy context. Each size runs once
        untimed first: the first forward of a new shape pays one-time kernel set-up costs that would
        otherwise read as a very expensive forward and switch speculation off."""
        cache = self.new_cache(context + max(sizes) + 8)
        ids = torch.arange(context, dtype=torch.long, device=self.device)[None, :] % self.vocab_size
        self._forward(ids, cache)
        for n in sizes:
            x = torch.full((1, n), 7 % self.vocab_size, dtype=torch.long, device=self.device)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                self._forward(x, cache, logits_to_keep=0)
                times.append(time.perf_counter() - t0)
                cache.truncate(context)
            self.cost.observe(n, min(times[1:]))

    def _check_prompt(self, prompt_ids: Sequence[int]) -> torch.Tensor:
        if len(prompt_ids) == 0:
            raise ValueError("prompt must contain at least one token")
        if len(prompt_ids) >= self.context_window:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens; the context window is {self.context_window}"
            )
        ids = torch.as_tensor(list(prompt_ids), dtype=torch.long, device=self.device)
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        return ids

    # ---------------------------------------------------------------------------------- drafting

    def _choose_draft(self, session: Any, dm: Any, spec: SpecParams, sampling: SamplingParams,
                      context: list[int], max_nodes: int) -> _Draft:
        """The draft for this step: the best-paying prefix of the lookup tree, a draft-model chain,
        or nothing."""
        t0 = time.perf_counter()
        costs = self.cost.table(max_nodes + 2)
        lookup_k, lookup_rate, tree = 0, 0.0, None
        if session is not None and max_nodes > 0:
            tree = session.propose(max_nodes, chain_only=not spec.tree)
            scores = self.calibration.apply(np.asarray(tree.score, dtype=np.float64))
            known = self.cost.known() or not self.policy.adaptive
            lookup_k = self.policy.choose(scores, costs) if known else min(len(scores), max_nodes)
            lookup_k = self.exploration.adjust(lookup_k, len(scores))
            if lookup_k and costs[lookup_k + 1] > 0:
                lookup_rate = (1.0 + float(scores[:lookup_k].sum())) / costs[lookup_k + 1]
        draft_s = time.perf_counter() - t0
        if dm is not None and max_nodes > 0 and not self.policy.adaptive and lookup_k == 0:
            return self._draft_model_chain(dm, context, min(max_nodes, self.gate.max_len), sampling, draft_s)
        if dm is not None and max_nodes > 0 and self.cost.known():
            dm_scores = self.gate.path_scores(min(max_nodes, self.gate.max_len))
            per_token = self.draft_cost.table(1)[1] if self.draft_cost.known() else costs[1] * 0.5
            k = self.policy.choose(dm_scores, costs, per_token)
            rate = (1.0 + float(dm_scores[:k].sum())) / (costs[k + 1] + k * per_token) if k else 0.0
            best_other = lookup_rate if lookup_k else (1.0 / costs[1] if costs[1] > 0 else 0.0)
            if not (k and rate > best_other) and lookup_k == 0 and self.gate.probe_due():
                k = min(self.gate.probe_len, max_nodes)  # explore: acceptance may have changed
                rate = best_other + 1.0
            if k and rate > best_other:
                return self._draft_model_chain(dm, context, k, sampling, draft_s)
            self.gate.steps_since_use += 1
        if tree is None or lookup_k == 0:
            return _Draft([], [], [], draft_s=draft_s, tree=tree)
        sub = tree.prefix(lookup_k)
        return _Draft([int(t) for t in sub.tokens], [int(p) for p in sub.parents],
                      [sub.source_names[int(s)] for s in sub.source], draft_s=draft_s, tree=sub)

    def _draft_model_chain(self, dm: Any, context: list[int], k: int, sampling: SamplingParams,
                           draft_s: float) -> _Draft:
        chain = dm.propose(context, k, sampling, sample=not sampling.greedy)
        self.gate.steps_since_use = 0
        self.draft_cost.observe(1, chain.seconds / max(len(chain.tokens), 1))
        return _Draft(chain.tokens, list(range(-1, len(chain.tokens) - 1)),
                      ["draft_model"] * len(chain.tokens), chain.probs, draft_s + chain.seconds)

    # ---------------------------------------------------------------------------------- generate

    def generate(
        self, prompt_ids: Sequence[int], params: GenerationParams, spec: SpecParams | None = None,
        scope: LookupScope | None = None,
    ) -> Generator[StepOutput, None, None]:
        """Yield one :class:`StepOutput` per target forward until EOS/stop id, max_tokens or the
        context window. ``spec`` controls speculation (default: the engine's); ``scope`` names the
        corpus and output stores this request may draft from."""
        ids = self._check_prompt(prompt_ids)
        spec = spec or self.default_spec
        sampling = params.sampling if params.sampling.greedy else params.sampling.with_seed()
        speculate = spec.enabled and spec.max_draft_tokens > 0
        stats = RequestStats()
        context = [int(t) for t in prompt_ids]
        max_draft = spec.max_draft_tokens if speculate else 0
        cache = self.new_cache(len(context) + params.max_tokens + max_draft + 2)
        t0 = time.perf_counter()
        logits = self._forward(ids[None, :], cache)
        stats.prefill_s = time.perf_counter() - t0

        session = self.lookup.session(context, spec, scope) if speculate else None
        dm = None
        if speculate and self.draft_model is not None and "draft_model" in spec.sources:
            from lookupspec.drafting.draft_model import DraftModelDrafter

            dm = DraftModelDrafter(self.draft_model, capacity=cache.capacity)

        L = len(context)  # cache length; the next token lands at index L
        token = int(select_tokens(logits, sampling, torch.tensor([L])).item())
        kept, reason = finish_tokens([token], 0, params, self.context_window - L)
        generated = len(kept)
        context.extend(kept)
        if session is not None:
            session.extend(kept)
        if reason is not None:  # recorded before the last yield: a consumer may close the generator there
            self._finish(stats, session)
            yield StepOutput(tuple(kept), reason, stats=stats)
            return
        yield StepOutput(tuple(kept), reason, stats=stats)
        root = token
        while True:
            # nodes may not reach past max_tokens (the bonus token is always emitted) or the window
            room = min(params.max_tokens - generated - 1, self.context_window - L - 2, max_draft)
            draft = self._choose_draft(session, dm, spec, sampling, context, room) if room > 0 else _EMPTY
            n = len(draft.tokens)
            t1 = time.perf_counter()
            result = self._verify_step(cache, L, root, draft, sampling)
            verify_s = time.perf_counter() - t1
            self.cost.observe(n + 1, verify_s)
            new = [draft.tokens[i] for i in result.accepted] + [result.next_token]
            kept, reason = finish_tokens(new, generated, params, self.context_window - L - 1)
            accepted = len(result.accepted)
            src_draft: dict[str, int] = {}
            for s in draft.sources:
                src_draft[s] = src_draft.get(s, 0) + 1
            src_acc: dict[str, int] = {}
            for i in result.accepted:
                src_acc[draft.sources[i]] = src_acc.get(draft.sources[i], 0) + 1
            stats.observe(draft=n, accepted=accepted, emitted=len(kept), source_draft=src_draft,
                          source_accepted=src_acc, draft_s=draft.draft_s, verify_s=verify_s)
            if draft.tree is not None and session is not None:
                session.feedback(draft.tree, result.accepted)
                if n and len(draft.tree.score) == n:  # the verified tree (not one refused whole)
                    self.calibration.observe_path(draft.tree.score, result.accepted)
            if n and draft.sources[0] == "draft_model":
                self.gate.observe(n, accepted)
            generated += len(kept)
            context.extend(kept)
            if session is not None:
                session.extend(kept)
            if reason is not None:
                self._finish(stats, session)
                yield StepOutput(tuple(kept), reason, n, accepted, stats)
                return
            yield StepOutput(tuple(kept), reason, n, accepted, stats)
            L += 1 + accepted
            root = result.next_token

    def _verify_step(self, cache: KVCache, L: int, root: int, draft: _Draft,
                     sampling: SamplingParams) -> VerifyResult:
        """One target forward over [root] + draft, verification, and KV compaction, all through
        ``lookupspec.kernels`` (Triton on CUDA, the torch twins elsewhere)."""
        n = len(draft.tokens)
        x = torch.tensor([[root, *draft.tokens]], dtype=torch.long, device=self.device)
        if n == 0 or draft.is_chain:
            logits = self._forward(x, cache, logits_to_keep=0)  # causal mask, positions L..L+n
        else:
            fwd_parents = [-1, *[p + 1 for p in draft.parents]]  # the root is node 0 of the forward
            parents = torch.tensor(fwd_parents, dtype=torch.long, device=self.device)
            mask, positions = kernels.tree_mask(parents, L, self.dtype)
            logits = self._forward(x, cache, logits_to_keep=0, attention_mask=mask, position_ids=positions)
        mode = "rejection" if draft.probs is not None else "greedy" if sampling.greedy else "match"
        batch = kernels.pack_requests([(draft.tokens, draft.parents)], [sampling], [L], device=self.device)
        out = kernels.verify_batch(logits, **batch._asdict(), mode=mode, draft_probs=draft.probs)
        # .results(): the step's one host sync; the host needs the tokens to stream and stop on
        result = out.results()[0]
        if n and not draft.is_chain and result.accepted != tuple(range(result.num_accepted)):
            with torch.inference_mode():  # the cache tensors are inference tensors
                kernels.compact_cache(cache, out.accepted, out.num_accepted, base=L + 1)
        cache.truncate(L + 1 + result.num_accepted)
        return result

    def _finish(self, stats: RequestStats, session: Any) -> None:
        self.aggregate.add(stats)
