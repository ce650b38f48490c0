"""One step for many sequences: draft each -> one target forward -> verify all -> KV bookkeeping.

The engine knows only token ids: tokenizers, chat templates, stop strings, HTTP and Redis live outside
it. A generation is a :class:`~lookupspec.sequence.SequenceState` the caller holds (words as defined
in ``lookupspec.verify``):

1. ``start(prompt_ids, params, spec, scope)`` checks the prompt and takes a KV slot;
   ``prefill(seq, max_tokens)`` runs the prompt through the target, in chunks if asked, and on the
   last chunk chooses the first token from its last row.
2. ``step(seqs)`` runs one step for every sequence given. Each sequence's *root* is its last emitted
   token (not yet in the KV cache, at position ``L`` = its cache length). The drafting policy
   proposes each sequence's draft (the best-paying prefix of its lookup tree, a draft-model chain, or
   nothing); all rows (root + draft nodes of every sequence) go through one ragged target forward
   (:class:`~lookupspec.runtime.ModelRunner`), each sequence attending only to its own cache with its
   own tree mask; ``kernels.verify_batch`` verifies every tree (one call per verification mode in the
   batch); the KV entries of rejected nodes are dropped (the accepted path compacted next to the root
   in one launch for every layer's keys and values, then each slot truncated to ``L + 1 + accepted``).
   Everything the step sends to the device travels in one host-to-device copy (a
   ``kernels.HostStage``), and it reads its results back with one device-to-host copy.
3. A sequence's accepted tokens and its recovered/bonus token are cut at EOS / stop ids / max_tokens
   exactly as the plain loop would cut them and returned as a :class:`~lookupspec.sequence.StepOutput`;
   a finished sequence frees its slot at once.

``iterate(seqs, prefills)`` is both in one forward: a step of ``seqs`` and a prompt chunk of each
sequence in ``prefills`` (``prefill`` and ``step`` are its two halves alone). A scheduler uses it so
that the running sequences' rows ride on a prompt chunk's forward. ``warmup()``
(:mod:`lookupspec.warmup`) compiles the kernels and seeds the step-cost model before serving.

``generate(prompt_ids, params, spec, scope)`` is the batch-of-one API on top: it yields one
``StepOutput`` per target forward.

Greedy steps emit the same tokens as plain greedy decoding; seeded sampling with deterministic drafts
(sample-and-match) emits the same tokens as plain seeded sampling, because every token is chosen by
``select_tokens`` with noise keyed by its absolute position. A sequence's tokens do not depend on
the other sequences of its batch where the runner's probe found the forward batch-invariant
(``runner.batch_invariant``; see :mod:`lookupspec.runtime.runner`).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lookupspec import kernels
from lookupspec.config import EngineConfig
from lookupspec.cost import BucketCosts, BudgetPolicy, Costs
from lookupspec.drafting.base import DraftSessions
from lookupspec.drafting.policy import Draft, DraftPolicy
from lookupspec.logits import LogitsProcessor, token_logprobs
from lookupspec.params import MAX_DRAFT_TOKENS, GenerationParams, LookupScope, SpecParams
from lookupspec.runtime import ModelRunner, PoolFull, SeqRows, use_runtime_attention
from lookupspec.runtime.prefix_cache import PrefixCache
from lookupspec.sampling import select_tokens
from lookupspec.sequence import SequenceState, StepOutput, finish_tokens
from lookupspec.stats import AggregateStats
from lookupspec.verify import VerifyResult

__all__ = ["PREFIX_BLOCK", "Engine", "Iteration", "SequenceState", "StepOutput", "finish_tokens"]

# The prefix cache's block where chunks are free: the 48 default bench prompts share ~64 tokens each
# with an earlier prompt (instruction headers), under one 128-token chunk
PREFIX_BLOCK = 32
# At most this many tokens of the text a sequence's grammar forces next are drafted per step
# (``Engine._prune``): an object's next key with its punctuation is rarely longer.
JUMP_TOKENS = 16
GRAMMAR_SOURCE = "grammar"  # the draft source those tokens are counted under


@dataclass
class Iteration:
    """What one :meth:`Engine.iterate` forward did."""

    steps: list[StepOutput]  # per decode sequence, in the order given
    prefills: list[StepOutput | None]  # per prompt chunk: None while its prompt is not done
    seconds: float  # the iteration's time, host work included
    decode_s: float  # the decode step's share: all of it without chunks, else its estimated cost alone


class Engine:
    """Speculative decoding of many sequences over a Hugging Face causal LM (and optionally a draft
    model sharing its tokenizer).

    ``config``: what the engine holds and how it runs its forwards (:class:`~lookupspec.config.EngineConfig`).
    With a ``kv_cache_bytes`` budget and a ``prefill_chunk``, a forward gives a slot at most
    :attr:`chunk_ceiling` prompt tokens or a step's root and largest draft tree, and sliding-window
    layers are sized for that. ``prefill_chunk`` is the prompt tokens per prefill forward in
    :meth:`generate`; a scheduler that interleaves prefills with steps passes the same value to
    :meth:`prefill` so that a request's tokens do not depend on how it was served. The prefix cache's
    block (``prefix_block_size``; None: :data:`PREFIX_BLOCK` where chunks are free, else
    ``prefill_chunk``) may be smaller than the chunk only where chunks are free (:attr:`free_chunks`).
    ``spec``: the default speculation of a request that names none; ``lookup``: the lookup drafting
    (None: :class:`~lookupspec.drafting.session.LookupDrafting`); ``policy``: the draft budget's rule."""

    def __init__(self, model: Any, config: EngineConfig | None = None, *, draft_model: Any | None = None,
                 spec: SpecParams | None = None, lookup: DraftSessions | None = None,
                 policy: BudgetPolicy | None = None) -> None:
        config = config if config is not None else EngineConfig()
        self.config = config
        cfg = model.config.get_text_config(decoder=True)
        window = config.context_window or getattr(cfg, "max_position_embeddings", None) or 2048
        self.context_window = int(window)
        self.prefill_chunk = config.prefill_chunk
        # A budgeted pool sizes sliding-window layers for the most rows a forward gives a slot: a
        # prompt chunk (at most chunk_ceiling tokens) or a step's root and largest draft tree.
        max_rows = (None if config.kv_cache_bytes is None or self.chunk_ceiling is None
                    else max(self.chunk_ceiling, 1 + MAX_DRAFT_TOKENS))
        self.runner = ModelRunner(model, context_window=self.context_window, lean=config.lean,
                                  max_batch=config.max_batch, kv_cache_bytes=config.kv_cache_bytes,
                                  max_rows=max_rows, cuda_graphs=config.cuda_graphs)
        self.model = model
        self.device = self.runner.device
        self.dtype = self.runner.dtype
        self.vocab_size = self.runner.vocab_size
        if draft_model is not None:
            use_runtime_attention(draft_model)
        self.draft_model = draft_model
        self.default_spec = spec or SpecParams()
        if lookup is None:
            from lookupspec.drafting.session import LookupDrafting

            lookup = LookupDrafting()
        self.lookup = lookup
        self.costs = Costs()  # measured: the drafting policy and the scheduler price with it
        choose = self.runner.bucket_choice()
        if choose is not None:  # the static step runs buckets whole: the budget fills them
            self.costs.buckets = BucketCosts(choose)
        self.drafting = DraftPolicy(policy, self.costs)
        self.aggregate = AggregateStats()
        self.prefix_block_size = self._prefix_block_size(config.prefix_block_size)
        self.prefix_cache: PrefixCache | None = None
        if config.prefix_cache_bytes > 0:  # EngineConfig checked that prompts are chunked
            self.prefix_cache = PrefixCache(self.runner.pool, self.prefix_block_size,
                                            config.prefix_cache_bytes)

    def _prefix_block_size(self, asked: int | None) -> int:
        """The prefix cache's block: a whole chunk where chunks are fixed (only a chunk at a fixed
        offset reproduces a prefill's bits), else ``asked`` or :data:`PREFIX_BLOCK` tokens, so that
        prompts sharing less than a chunk (a system prompt, an instruction header) share blocks."""
        chunk = self.prefill_chunk  # EngineConfig checked 1 <= asked <= chunk
        if chunk is None:
            return 0
        if not self.free_chunks:
            if asked is not None and asked != chunk:
                raise ValueError(f"prefix_block_size {asked} needs a chunk-invariant forward (free chunks); "
                                 f"this model's chunks stay whole, so its blocks are its prefill chunk "
                                 f"({chunk})")
            return chunk
        return min(chunk, PREFIX_BLOCK) if asked is None else asked

    @property
    def chunk_ceiling(self) -> int | None:
        """The most prompt tokens one forward may carry for a sequence: two prefill chunks (the
        scheduler's when the prefill must catch up; None: prompts are not chunked)."""
        return None if self.prefill_chunk is None else 2 * self.prefill_chunk

    @property
    def free_chunks(self) -> bool:
        """Whether a prompt may be prefilled in chunks of any size at any offset without changing a
        token: the forward is chunk-invariant (the runner's probe) and every sliding window is at
        least a ``prefill_chunk`` long, so a prefix-cache block that took several forwards still holds
        all its entries when it is kept. Otherwise chunks stay whole, at multiples of
        ``prefill_chunk``."""
        windows = [s.window for s in self.runner.layers if s.window is not None]
        block = self.prefill_chunk or 0
        return self.runner.chunk_invariant and all(w >= block for w in windows)

    @property
    def lean(self) -> Any:
        """The runner's lean forward, or None when it runs transformers' forward."""
        return self.runner.lean

    # ------------------------------------------------------------------------------------ lifecycle

    def check_prompt(self, prompt_ids: Sequence[int]) -> tuple[int, ...]:
        if len(prompt_ids) == 0:
            raise ValueError("prompt must contain at least one token")
        if len(prompt_ids) >= self.context_window:
            raise ValueError(
                f"prompt has {len(prompt_ids)} tokens; the context window is {self.context_window}"
            )
        ids = tuple(int(t) for t in prompt_ids)
        if min(ids) < 0 or max(ids) >= self.vocab_size:
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        return ids

    def start(self, prompt_ids: Sequence[int], params: GenerationParams, spec: SpecParams | None = None,
              scope: LookupScope | None = None, namespace: str | None = None) -> SequenceState:
        """A new sequence with a KV slot (raises ValueError for a bad prompt, :class:`PoolFull` when
        no slot is free or the pool cannot hold the prompt). Nothing runs until :meth:`prefill`.

        The slot gets room for the prompt, ``max_tokens`` and a step's draft when the pool's budget
        allows, else for the prompt and one step (with its draft where a slot's share holds it, else
        one token): it then grows as the sequence does, and when it cannot (the budget of
        ``kv_cache_bytes``) the sequence ends with ``finish_reason="length"`` while the rest of the
        batch goes on."""
        ids = self.check_prompt(prompt_ids)
        spec = spec or self.default_spec
        sampling = params.sampling if params.sampling.greedy else params.sampling.with_seed()
        speculate = spec.enabled and spec.max_draft_tokens > 0
        max_draft = spec.max_draft_tokens if speculate else 0
        reserve = min(len(ids) + params.max_tokens + max_draft + 2, self.context_window)
        slot = self._allocate((reserve, len(ids) + max_draft + 2, len(ids) + 1))
        seq = SequenceState(ids, params, spec, sampling, slot, scope=scope, context=list(ids))
        lp = params.logits
        if lp.rewrites or lp.logprobs is not None:
            try:
                seq.logits = LogitsProcessor(lp, ids, self.vocab_size, params.end_token_ids, self.device)
            except Exception:
                self.runner.free(slot)
                raise
        if self.prefix_cache is not None and namespace is not None and (
                self.free_chunks or self.prefix_block_size == self.prefill_chunk):
            seq.namespace = namespace
            blocks = self.prefix_cache.lookup(namespace, ids)
            if blocks:
                seq.prefilled = seq.stats.cached_tokens = self.prefix_cache.load(slot, blocks)
                seq.prefix_block = blocks[-1]
        if speculate:
            seq.session = self.lookup.session(seq.context, spec, scope)
            if self.draft_model is not None and "draft_model" in spec.sources:
                from lookupspec.drafting.draft_model import DraftModelDrafter

                seq.draft_model = DraftModelDrafter(self.draft_model, capacity=reserve)
        return seq

    def _allocate(self, wants: Sequence[int]) -> int:
        """A slot with room for the first of ``wants`` (positions) that the pool can give: the whole
        generation, so that the slot never grows mid-flight, else less (it grows later or the
        sequence ends with "length"). Raises the last :class:`PoolFull`."""
        for want in wants[:-1]:
            try:
                return self.runner.allocate(min(want, self.context_window))
            except PoolFull:
                pass
        return self.runner.allocate(min(wants[-1], self.context_window))

    def release(self, seq: SequenceState) -> None:
        """Free the sequence's slot (idempotent): a finished sequence is released by the engine; a
        caller that abandons one (cancel, deadline) calls this."""
        if not seq.released:
            seq.released = True
            seq.prefill_logits = None
            self.runner.free(seq.slot)

    def rollback(self, seq: SequenceState) -> None:
        """Drop whatever a failed forward wrote past the sequence's committed positions."""
        if not seq.released and self.runner.length(seq.slot) > seq.cache_len:
            self.runner.pool.truncate(seq.slot, seq.cache_len)

    @torch.inference_mode()
    def fork(self, parent: SequenceState, params: GenerationParams) -> tuple[SequenceState, StepOutput]:
        """Another choice of ``parent``'s prompt (``n > 1``): a new sequence whose slot copies the
        parent's prefilled prompt instead of running it again, and its first token from the prompt's
        last row with its own sampling. Call it right after the parent's prefill finished."""
        if parent.prefill_logits is None or not parent.prefill_done:
            raise ValueError("fork() needs a parent whose prefill has just finished")
        seq = self.start(parent.prompt, params, parent.spec, parent.scope)
        try:
            self.runner.pool.copy_prefix(parent.slot, seq.slot, len(parent.prompt))
        except Exception:
            self.release(seq)
            raise
        seq.prefilled = len(seq.prompt)
        seq.stats.prefill_s = 0.0
        return seq, self._first_token(seq, parent.prefill_logits)

    def _finish(self, seq: SequenceState, reason: str) -> None:
        seq.finish_reason = reason
        self.aggregate.add(seq.stats)
        self.release(seq)

    # ---------------------------------------------------------------------------------- iterations

    def prefill(self, seq: SequenceState, max_tokens: int | None = None) -> StepOutput | None:
        """Prefill up to ``max_tokens`` more prompt tokens in a forward of their own. Returns None
        while the prompt is not done; on its last chunk, the first token's :class:`StepOutput`.
        ``max_tokens=None``: the rest of the prompt, in one forward, or where the engine chunks
        prompts (``prefill_chunk``) in forwards of ``prefill_chunk`` tokens, as :meth:`generate`
        does: the same tokens, and no forward wider than a budgeted pool's sliding-window layers
        were sized for."""
        if max_tokens is not None or self.prefill_chunk is None:
            return self.iterate((), [(seq, max_tokens)]).prefills[0]
        out = None
        while out is None:
            out = self.iterate((), [(seq, self.prefill_chunk)]).prefills[0]
        return out

    def step(self, seqs: Sequence[SequenceState], max_rows: int | None = None) -> list[StepOutput]:
        """One decode/verify step for every sequence in ``seqs`` (each prefilled, not finished);
        returns their outputs in the same order. ``max_rows`` caps the step's rows (root + draft
        nodes of every sequence; at least one per sequence)."""
        return self.iterate(seqs, (), max_rows).steps

    @torch.inference_mode()
    def iterate(self, seqs: Sequence[SequenceState],
                prefills: Sequence[tuple[SequenceState, int | None]] = (),
                max_rows: int | None = None) -> Iteration:
        """One target forward for a decode/verify step of every sequence in ``seqs`` (as :meth:`step`)
        and a prompt chunk of every ``(sequence, max_tokens)`` in ``prefills`` (as :meth:`prefill`).

        A chunk's rows go through the same forward as the step's, as a causal chain in its own slot,
        and only its last row's logits are computed. On this kind of CPU a 128-row chunk is
        compute-bound while a decode step of a few rows mostly reads the weights, so the step's rows
        ride along with the chunk for a fraction of a step of their own. Every row is computed as it
        would be alone (the runner's batch-invariance probe), so outputs do not depend on what shared
        the forward."""
        for s in seqs:
            if not s.running:
                raise ValueError("step() takes sequences that are prefilled and not finished")
            s.prefill_logits = None  # forks happen before a sequence's first step
        drafts, run, outputs = self._choose(seqs, max_rows, bool(prefills)) if seqs else ([], [], {})
        pre_out: dict[int, StepOutput | None] = {}
        chunks: list[tuple[int, SequenceState, int, int]] = []  # (index in prefills, seq, start, end)
        for j, (s, max_tokens) in enumerate(prefills):
            if s.released or s.prefill_done:
                raise ValueError("this sequence is not waiting for a prefill")
            start = s.prefilled
            end = len(s.prompt) if max_tokens is None else min(len(s.prompt), start + max_tokens)
            if not self.runner.reserve(s.slot, end):
                self._finish(s, "length")
                pre_out[j] = StepOutput((), "length", stats=s.stats)
                continue
            chunks.append((j, s, start, end))
        seconds = decode_s = 0.0
        if run or chunks:
            seconds, decode_s, last_rows = self._run(seqs, drafts, run, outputs, chunks)
            chunk_rows = sum(end - start for _, _, start, end in chunks)
            for (j, s, start, end), logits in zip(chunks, last_rows, strict=True):
                s.stats.prefill_s += (seconds - decode_s) * (end - start) / chunk_rows
                pre_out[j] = self._prefilled(s, start, end, logits.float())
        return Iteration([outputs[i] for i in range(len(seqs))], [pre_out[j] for j in range(len(prefills))],
                         seconds, decode_s)

    def _prefilled(self, seq: SequenceState, start: int, end: int, logits: torch.Tensor) -> StepOutput | None:
        """Book a chunk ``prompt[start:end]`` that has gone through the forward (``logits``: its last
        row's): keep every ``prefix_block_size`` block it completes in the prefix cache (where chunks are
        fixed a block is a whole chunk; where they are free a chunk may complete several blocks or a
        part of one), and choose the first token when the prompt is done."""
        seq.prefilled = end
        block = self.prefix_block_size
        if self.prefix_cache is not None and block:
            for edge in range((start // block + 1) * block, end + 1, block):  # blocks completed by this chunk
                lo = edge - block
                if seq.namespace is not None and not (self.free_chunks or (start, end) == (lo, edge)):
                    seq.namespace = None  # prefilled in other chunks, its bits may differ: not kept
                if seq.namespace is None:
                    break  # nothing after a block that is not kept can be
                seq.prefix_block = self.prefix_cache.store(seq.namespace, seq.prefix_block,
                                                           seq.prompt[lo:edge], seq.slot, lo)
                if seq.prefix_block is None:
                    seq.namespace = None
        if not seq.prefill_done:
            return None
        seq.prefill_logits = logits
        return self._first_token(seq, logits)

    def _first_token(self, seq: SequenceState, logits: torch.Tensor) -> StepOutput:
        """logits: [vocab], the prompt's last row."""
        L = len(seq.prompt)  # the first token lands at position L
        positions = torch.tensor([L], dtype=torch.int64, device=logits.device)
        rows = logits[None, :]
        raw = None
        if seq.logits is not None:  # a copy: a fork's parent keeps its prompt row unprocessed
            seq.unpruned, seq.tree_masks = Draft(), seq.logits.prune([], [])
            raw, rows = rows, rows.float().clone()
            seq.logits.apply(rows, [], [], seq.tree_masks)
        token = int(select_tokens(rows, seq.sampling, positions).item())
        kept, reason = finish_tokens([token], 0, seq.params, self.context_window - L)
        if seq.logits is not None:
            return self._emit_processed(seq, Draft(), (), kept, reason, raw, 0.0, True)
        return self._emit(seq, kept, reason, 0, 0)

    def _emit(self, seq: SequenceState, kept: list[int], reason: str | None, drafted: int,
              accepted: int) -> StepOutput:
        seq.generated += len(kept)
        seq.context.extend(kept)
        if seq.session is not None:
            seq.session.extend(kept)
        if reason is not None:  # recorded before the output is handed over: a consumer may stop there
            self._finish(seq, reason)
        return StepOutput(tuple(kept), reason, drafted, accepted, seq.stats)

    def _choose(self, seqs: Sequence[SequenceState], max_rows: int | None,
                shared: bool = False) -> tuple[list[Draft], list[int], dict[int, StepOutput]]:
        """Every sequence's draft and room for its rows (``shared``: the forward carries prompt
        chunks too). Returns the drafts, the indices of the sequences that take part in the forward,
        and the outputs of those that ended instead (no room)."""
        rooms = [max(0, min(s.params.max_tokens - s.generated - 1, self.context_window - s.cache_len - 2,
                            s.max_draft)) for s in seqs]
        chosen = self.drafting.choose_batch([s.draft_inputs() for s in seqs], rooms,
                                            [s.cache_len for s in seqs], max_rows, shared)
        drafts: list[Draft] = []
        outputs: dict[int, StepOutput] = {}
        run: list[int] = []
        # rows the grammar's own drafts may add (forced text: keys, punctuation) within max_rows
        spare = JUMP_TOKENS * len(seqs) if max_rows is None else max_rows - sum(len(d) + 1 for d in chosen)
        for i, (s, draft) in enumerate(zip(seqs, chosen, strict=True)):
            L = s.cache_len
            if s.logits is not None:
                jump = min(JUMP_TOKENS, max(0, spare), rooms[i] - len(draft)) if s.max_draft else 0
                before = len(draft)
                draft = self._prune(s, draft, jump)
                spare -= max(0, len(draft) - before)
            if len(draft) and not self.runner.reserve(s.slot, L + 1 + len(draft)):
                draft = Draft(draft_s=draft.draft_s)  # no room for the draft: a plain step
            if not self.runner.reserve(s.slot, L + 1):
                self._finish(s, "length")  # the slot cannot grow: this request ends, the batch goes on
                outputs[i] = StepOutput((), "length", stats=s.stats)
                drafts.append(draft)
                continue
            drafts.append(draft)
            run.append(i)
        return drafts, run, outputs

    def _prune(self, seq: SequenceState, draft: Draft, jump: int = 0) -> Draft:
        """A processed sequence's draft, without the nodes its grammar forbids along their paths
        (pruned before the forward: they would cost rows and could never be accepted), and with at
        most ``jump`` tokens of the text the grammar forces next drafted (source ``grammar``;
        ``lookupspec.constraints.state``). A sampled draft-model chain is verified by sample-and-match
        instead of rejection sampling (exact per seed for any draft; rejection sampling would need
        the processed target distribution)."""
        seq.unpruned = draft
        masks = seq.tree_masks = seq.logits.prune(draft.tokens, draft.parents, jump)  # type: ignore[union-attr]
        if masks is None or masks.kept == tuple(range(len(draft))):
            return draft if draft.probs is None else Draft(draft.tokens, draft.parents, draft.sources, None,
                                                          draft.draft_s, draft.tree)
        sources = [draft.sources[i] if i >= 0 else GRAMMAR_SOURCE for i in masks.kept]
        return Draft(list(masks.tokens), list(masks.parents), sources, None, draft.draft_s, None)

    def _process(self, seqs: Sequence[SequenceState], drafts: list[Draft], order: list[int],
                 logits: torch.Tensor) -> dict[int, torch.Tensor]:
        """Rewrite the step's rows of every processed sequence in place (grammar masks, penalties,
        logit bias, min_tokens: ``lookupspec.logits``) before verification; returns, for those that
        asked for log-probabilities, a copy of their rows as the target gave them. logits:
        [step rows, vocab], the sequences of ``order`` one after another."""
        raws: dict[int, torch.Tensor] = {}
        row = 0
        for i in order:
            n = len(drafts[i]) + 1
            s = seqs[i]
            if s.logits is not None:
                block = logits[row:row + n]
                if s.params.logits.logprobs is not None:
                    raws[i] = block.clone()
                if s.params.logits.rewrites:
                    work = block.float()
                    s.logits.apply(work, drafts[i].tokens, drafts[i].parents, s.tree_masks)
                    if work.data_ptr() != block.data_ptr():
                        block.copy_(work)
            row += n
        return raws

    def _run(self, seqs: Sequence[SequenceState], drafts: list[Draft], run: list[int],
             outputs: dict[int, StepOutput], chunks: Sequence[tuple[int, SequenceState, int, int]],
             ) -> tuple[float, float, list[torch.Tensor]]:
        """The iteration's device work, with one host-to-device copy of all its inputs (the ragged
        batch, every verification group's layout, the KV compaction plan: one
        :class:`kernels.HostStage`) and one device-to-host read of the step's results. Returns the
        seconds it took, the decode step's share of them and each chunk's last-row logits."""
        # rows grouped by verification rule, so that each group's logits rows are contiguous
        rejection = [i for i in run if drafts[i].probs is not None]
        order = [i for i in run if drafts[i].probs is None] + rejection
        split = len(order) - len(rejection)
        t0 = time.perf_counter()
        stage = kernels.HostStage(self.device)
        rows = []
        for i in order:
            d = drafts[i]
            parents = None if d.is_chain else [-1, *[p + 1 for p in d.parents]]
            rows.append(SeqRows(seqs[i].slot, [seqs[i].root, *d.tokens], parents))
        n_step = sum(len(r.tokens) for r in rows)
        keep = None
        if chunks:  # logits of the step's rows and of each chunk's last row only
            lasts = np.cumsum([end - start for _, _, start, end in chunks]) + n_step - 1
            keep = stage.add(np.concatenate([np.arange(n_step), lasts]).astype(np.int64), torch.int64)
            rows += [SeqRows(s.slot, s.prompt[start:end]) for _, s, start, end in chunks]
        batch = self.runner.plan(rows, stage)
        groups = []
        for rejection_group, group in ((False, order[:split]), (True, order[split:])):
            if group:
                packed = kernels.stage_requests([(drafts[i].tokens, drafts[i].parents) for i in group],
                                                [seqs[i].sampling for i in group],
                                                [seqs[i].cache_len for i in group], stage)
                groups.append((rejection_group, group, packed))
        # KV: the root and the accepted path stay, the accepted path moved next to the root. Every
        # sequence of a step with a tree takes part (a chain's path does not move: no stores), so the
        # plan needs nothing from the verification results.
        plan = None
        if any(not drafts[i].is_chain for i in order):
            plan = self.runner.pool.plan_compact([seqs[i].slot for i in order],
                                                 [seqs[i].cache_len + 1 for i in order], stage)
        stage.upload()  # the iteration's one host-to-device copy
        logits = self.runner.run(batch, None if keep is None else keep.tensor)  # [kept rows, vocab]
        results = []
        raws: dict[int, torch.Tensor] = {}
        if any(seqs[i].logits is not None for i in order):
            raws = self._process(seqs, drafts, order, logits[:n_step])
        if order:
            joined = self._verify(seqs, drafts, groups, logits[:n_step])
            if plan is not None:
                self.runner.pool.compact_planned(plan, joined.accepted, joined.num_accepted)
            results = joined.results()  # the step's one device-to-host read
            for j, i in enumerate(order):
                s = seqs[i]
                self.runner.pool.truncate(s.slot, s.cache_len + 1 + results[j].num_accepted)
        seconds = time.perf_counter() - t0
        step_rows = [len(drafts[i]) + 1 for i in order]
        contexts = [seqs[i].cache_len for i in order]
        decode_s = seconds if order else 0.0
        if order and chunks:  # the step's share of a shared forward: what it would cost alone, at most
            steps = self.costs.steps
            alone = (steps.predict(step_rows, contexts) if steps.known()
                     else seconds * n_step / batch.real_rows)
            decode_s = min(seconds, alone)
            if steps.known():  # what the chunk's rows cost beyond the step: a draft row's price here
                steps.observe_chunk(sum(end - start for _, _, start, end in chunks), seconds - decode_s)
        elif order:  # only a step's own forward says what steps cost
            self.costs.steps.observe(step_rows, contexts, seconds)
            bucket = self.runner.bucket_of(batch)
            if bucket is not None and self.costs.buckets is not None:
                self.costs.buckets.observe(bucket, seconds)
        for j, i in enumerate(order):
            outputs[i] = self._advance(seqs[i], drafts[i], results[j], decode_s, raws.get(i))
        return seconds, decode_s, [logits[n_step + k] for k in range(len(chunks))]

    def _verify(self, seqs: Sequence[SequenceState], drafts: list[Draft],
                groups: list[tuple[bool, list[int], kernels.StagedRequests]],
                logits: torch.Tensor) -> kernels.BatchVerifyOutput:
        """Verify every sequence's tree, one ``verify_batch`` per group: the greedy or sample-and-match
        rule, then (sampled draft-model chains) rejection sampling. Returns the joined outputs, on
        the device."""
        outs = []
        row = 0
        for rejection, group, packed in groups:
            n_rows = sum(len(drafts[i]) + 1 for i in group)
            if not rejection:
                mode = "greedy" if all(seqs[i].sampling.greedy for i in group) else "match"
                probs = None
            else:
                mode = "rejection"
                probs = torch.cat([drafts[i].probs for i in group])  # type: ignore[misc]
            outs.append(kernels.verify_batch(logits[row:row + n_rows], **packed.batch()._asdict(), mode=mode,
                                             draft_probs=probs, checked=True))  # stage_requests checked
            row += n_rows
        if len(outs) == 1:
            return outs[0]
        width = max(o.accepted.shape[1] for o in outs)
        accepted = torch.cat([torch.nn.functional.pad(o.accepted, (0, width - o.accepted.shape[1]), value=-1)
                              for o in outs])
        return kernels.BatchVerifyOutput(accepted, torch.cat([o.num_accepted for o in outs]),
                                         torch.cat([o.next_token for o in outs]),
                                         torch.cat([o.recovered for o in outs]))

    def _advance(self, seq: SequenceState, draft: Draft, result: VerifyResult, step_s: float,
                 raw: torch.Tensor | None = None) -> StepOutput:
        L = seq.cache_len
        new = [draft.tokens[i] for i in result.accepted] + [result.next_token]
        kept, reason = finish_tokens(new, seq.generated, seq.params, self.context_window - L - 1)
        if seq.logits is not None:
            return self._emit_processed(seq, draft, result.accepted, kept, reason, raw, step_s, False)
        accepted = result.num_accepted
        src_draft: dict[str, int] = {}
        for src in draft.sources:
            src_draft[src] = src_draft.get(src, 0) + 1
        src_acc: dict[str, int] = {}
        for node in result.accepted:
            src_acc[draft.sources[node]] = src_acc.get(draft.sources[node], 0) + 1
        seq.stats.observe(draft=len(draft), accepted=accepted, emitted=len(kept), source_draft=src_draft,
                          source_accepted=src_acc, draft_s=draft.draft_s, verify_s=step_s)
        self.drafting.observe(seq.session, draft, result.accepted)
        return self._emit(seq, kept, reason, len(draft), accepted)

    def _emit_processed(self, seq: SequenceState, draft: Draft, accepted: Sequence[int], kept: list[int],
                        reason: str | None, raw: torch.Tensor | None, step_s: float,
                        first: bool) -> StepOutput:
        """``_advance``/``_first_token`` for a processed sequence: a grammar that dead-ends on the
        emitted path ends this request alone (``finish_reason="error"``); the drafters learn from the
        draft they proposed (before pruning); the log-probabilities come from the verifying rows."""
        masks = seq.tree_masks
        unpruned = seq.unpruned if seq.unpruned is not None else draft
        seq.unpruned = seq.tree_masks = None
        error = None
        assert seq.logits is not None
        took = seq.logits.commit(kept)
        if took < len(kept):  # a row where every token was refused chose a refused one
            kept, reason = kept[:took], "error"
            error = ("the output's grammar allows no token here (its schema dead-ends, or min_tokens "
                     "refuses the end of a completed output): generation stopped")
        rows = [0, *[a + 1 for a in accepted]][:len(kept)]  # the row that chose each emitted token
        lps = None
        k = seq.params.logits.logprobs
        if k is not None and raw is not None:
            lps = tuple(token_logprobs(raw, rows, kept, k))
        if not first:  # a step (the first token comes from the prefill: no step to record)
            kept_nodes = masks.kept if masks is not None else tuple(range(len(draft)))
            src_draft: dict[str, int] = {}
            for src in draft.sources:
                src_draft[src] = src_draft.get(src, 0) + 1
            src_acc: dict[str, int] = {}
            for node in accepted:
                src_acc[draft.sources[node]] = src_acc.get(draft.sources[node], 0) + 1
            seq.stats.observe(draft=len(draft), accepted=len(accepted), emitted=len(kept),
                              source_draft=src_draft, source_accepted=src_acc, draft_s=draft.draft_s,
                              verify_s=step_s)
            # nodes the grammar drafted are no drafter's (-1): the accepted path's drafter nodes, if
            # any, are its first ones (a drafter node below a grammar node merged into the chain)
            self.drafting.observe(seq.session, unpruned,
                                  tuple(kept_nodes[a] for a in accepted if kept_nodes[a] >= 0))
        if error is not None:
            seq.error = error
        out = self._emit(seq, kept, reason, len(draft), len(accepted))
        return StepOutput(out.tokens, out.finish_reason, out.draft_tokens, out.accepted_tokens, out.stats,
                          lps, error)

    # ---------------------------------------------------------------------------------- generate

    def generate(
        self, prompt_ids: Sequence[int], params: GenerationParams, spec: SpecParams | None = None,
        scope: LookupScope | None = None, namespace: str | None = None,
    ) -> Generator[StepOutput, None, None]:
        """Yield one :class:`StepOutput` per target forward until EOS/stop id, max_tokens or the
        context window. ``spec`` controls speculation (default: the engine's); ``scope`` names the
        corpus and output indexes this request may draft from; ``namespace`` enables the prefix cache
        for this prompt (None: neither reused nor kept)."""
        seq = self.start(prompt_ids, params, spec, scope, namespace)
        try:
            out = self.prefill(seq)
            assert out is not None  # prefill(seq) runs to the prompt's end
            yield out
            while seq.finish_reason is None:
                yield self.step([seq])[0]
        finally:
            self.release(seq)

    # ------------------------------------------------------------------------------------ warm-up

    def warmup(self, sizes: Sequence[int] = (1, 2, 4, 8, 16, 32), batches: Sequence[int] = (1, 2, 4, 8),
               context: int = 64) -> None:
        """Compile every kernel variant a step can use and seed the step-cost model with measured
        forwards (:func:`lookupspec.warmup.warm_up`)."""
        from lookupspec.warmup import warm_up

        warm_up(self, sizes, batches, context)

    def cost_table(self, upto: int, context: int = 1000) -> Any:
        """Estimated seconds of a one-sequence step over 1..upto rows at ``context`` cached positions
        (index 0 unused), from the step cost model; None before anything was measured."""
        steps = self.costs.steps
        return steps.table(upto, context) if steps.known() else None
