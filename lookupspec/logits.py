"""Per-request logits processing: grammar masks, penalties, logit bias, min_tokens; log-probabilities.

Words as in ``lookupspec.verify``. Every row of a step predicts one position: row 0 (the root) the
next token after the emitted ones, row ``i + 1`` the token after draft node ``i``. A row's *path* is
the drafts from the root down to its node (empty for the root). :meth:`LogitsProcessor.apply`
rewrites each row's logits as plain decoding would rewrite them at that position, given that the
path had been emitted:

1. the grammar mask of the state after the path (refused tokens pushed to the lowest float);
2. ``min_tokens``: the end tokens refused while fewer than ``min_tokens`` tokens (counting the path)
   were emitted;
3. ``logit_bias`` added;
4. ``repetition_penalty`` (vLLM's: a logit of a token seen in the prompt or the output is divided by
   it when positive, multiplied when negative), then ``frequency_penalty`` times the token's count in
   the output and ``presence_penalty`` once per token present in the output, subtracted; the output
   counts are the emitted tokens plus the path's.

The verifier then chooses on the rewritten rows with its usual rule (greedy argmax, or
temperature/top-k/top-p and position-keyed noise), so a node is accepted exactly when plain
constrained decoding would have emitted it: outputs with speculation on and off are the same.

Log-probabilities are vLLM's default (raw) ones: the log-softmax of the target's own logits at the
row that chose each emitted token, before any of the processing above, taken from the forward that
verified the token (no extra forward).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

from lookupspec.constraints import Grammar, GrammarState, TreeMasks, apply_bitmask
from lookupspec.constraints.state import REFUSED

__all__ = ["MAX_TOP_LOGPROBS", "LogitsParams", "LogitsProcessor", "TokenLogprob", "token_logprobs"]

MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """The log-probability of one emitted token and the ``top`` alternatives at its position (most
    likely first; ``k`` of them as the request asked)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class LogitsParams:
    """A request's logits processing. Defaults change nothing; ``logprobs`` None returns none, ``k``
    returns each token's log-probability and its ``k`` most likely alternatives."""

    frequency_penalty: float = 0.0  # [-2, 2]
    presence_penalty: float = 0.0  # [-2, 2]
    repetition_penalty: float = 1.0  # > 0; 1 is off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100])
    min_tokens: int = 0
    logprobs: int | None = None  # top alternatives per token (0..20); None: no log-probabilities
    grammar: Grammar | None = None

    def __post_init__(self) -> None:
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            if not (-2.0 <= v <= 2.0):
                raise ValueError(f"{name} must be in [-2, 2], got {v}")
        if not (0.0 < self.repetition_penalty <= 2.0) or math.isnan(self.repetition_penalty):
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        for tok, bias in self.logit_bias:
            if tok < 0:
                raise ValueError(f"logit_bias token ids must be >= 0, got {tok}")
            if not (-100.0 <= bias <= 100.0):
                raise ValueError(f"logit_bias values must be in [-100, 100], got {bias} for token {tok}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs}")

    @property
    def penalized(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0)

    @property
    def rewrites(self) -> bool:
        """Whether any row's logits change (log-probabilities alone change none)."""
        return bool(self.penalized or self.logit_bias or self.min_tokens or self.grammar is not None)


class LogitsProcessor:
    """The processing state of one sequence: its grammar state at the root and its output counts."""

    def __init__(self, params: LogitsParams, prompt: Sequence[int], vocab_size: int,
                 end_token_ids: Collection[int], device: torch.device) -> None:
        self.params = params
        self.vocab_size = vocab_size
        self.end_token_ids = frozenset(int(t) for t in end_token_ids)
        self.device = device
        self.grammar = None if params.grammar is None else GrammarState(params.grammar)
        if params.grammar is not None and params.grammar.vocab_size < vocab_size:
            raise ValueError(f"the grammar was compiled for {params.grammar.vocab_size} tokens, the model "
                             f"has {vocab_size}")
        self.generated = 0
        self.counts: torch.Tensor | None = None  # [vocab] float32 output counts (penalties only)
        self.in_prompt: torch.Tensor | None = None  # [vocab] bool (repetition penalty only)
        if params.penalized:
            self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)
        if params.repetition_penalty != 1.0:
            self.in_prompt = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            self.in_prompt[torch.as_tensor(list(prompt), dtype=torch.int64, device=device)] = True
        self._bias: torch.Tensor | None = None
        if params.logit_bias:
            bias = torch.zeros(vocab_size, dtype=torch.float32)
            for tok, b in params.logit_bias:
                if tok >= vocab_size:
                    raise ValueError(f"logit_bias token id {tok} is outside the vocabulary ({vocab_size})")
                bias[tok] += b
            self._bias = bias.to(device)
        self._ends = torch.tensor(sorted(t for t in self.end_token_ids if t < vocab_size), dtype=torch.int64,
                                  device=device)

    def prune(self, tokens: Sequence[int], parents: Sequence[int], jump: int = 0) -> TreeMasks | None:
        """Walk the draft tree under the grammar before the forward, adding at most ``jump`` tokens of
        the text the grammar forces next (:meth:`GrammarState.walk`); None: no grammar, nothing
        pruned or added."""
        if self.grammar is None:
            return None
        return self.grammar.walk(tokens, parents, self.end_token_ids, jump)

    def apply(self, logits: torch.Tensor, tokens: Sequence[int], parents: Sequence[int],
              masks: TreeMasks | None) -> None:
        """Rewrite the rows of one sequence's step in place. logits: [n + 1, vocab] float32, row 0 the
        root; tokens, parents: [n] the verified (pruned) draft; masks: :meth:`prune`'s result for it."""
        n = len(tokens)
        if logits.shape[0] != n + 1:
            raise ValueError(f"logits must be [n + 1, vocab] = [{n + 1}, vocab], got {tuple(logits.shape)}")
        p = self.params
        if masks is not None:
            apply_bitmask(logits, masks.masks)
        depth = [0] * (n + 1)  # tokens on each row's path
        for i, par in enumerate(parents):
            depth[i + 1] = depth[par + 1] + 1
        if p.min_tokens and self._ends.numel():
            rows = [r for r in range(n + 1) if self.generated + depth[r] < p.min_tokens]
            if rows:
                idx = torch.tensor(rows, dtype=torch.int64, device=logits.device)
                logits[idx[:, None], self._ends[None, :]] = REFUSED
        if self._bias is not None:
            logits.add_(self._bias)
        if self.counts is not None:
            counts = self.counts.expand(n + 1, -1).clone()  # [n + 1, vocab]
            r_idx: list[int] = []
            t_idx: list[int] = []
            for i in range(n):  # each node's token counts on its own row and below
                node, row = i, i + 1
                while node >= 0:
                    r_idx.append(row)
                    t_idx.append(int(tokens[node]))
                    node = parents[node]
            if r_idx:
                dev = logits.device
                counts.index_put_((torch.tensor(r_idx, device=dev), torch.tensor(t_idx, device=dev)),
                                  torch.ones(len(r_idx), device=dev), accumulate=True)
            if p.repetition_penalty != 1.0:
                assert self.in_prompt is not None
                seen = (counts > 0) | self.in_prompt
                scaled = torch.where(logits > 0, logits / p.repetition_penalty, logits * p.repetition_penalty)
                logits.copy_(torch.where(seen, scaled, logits))
            if p.frequency_penalty:
                logits.sub_(counts * p.frequency_penalty)
            if p.presence_penalty:
                logits.sub_((counts > 0).float() * p.presence_penalty)

    def commit(self, tokens: Sequence[int]) -> int:
        """Move the grammar over the tokens a step emitted and count them; returns how many the
        grammar took (all of them unless a row allowed no token at all: see
        :meth:`GrammarState.commit`); only those are counted."""
        if self.grammar is not None:
            tokens = list(tokens)[: self.grammar.commit(tokens)]
        self.generated += len(tokens)
        if self.counts is not None and tokens:
            idx = torch.as_tensor(list(tokens), dtype=torch.int64, device=self.counts.device)
            self.counts.index_add_(0, idx, torch.ones(len(tokens), device=self.counts.device))
        return len(tokens)


def token_logprobs(raw: torch.Tensor, rows: Sequence[int], tokens: Sequence[int],
                   k: int) -> list[TokenLogprob]:
    """The log-probability of ``tokens[j]`` at row ``rows[j]`` of ``raw`` ([rows, vocab], the target's
    unprocessed logits) and its ``k`` most likely alternatives, one device-to-host read."""
    if not tokens:
        return []
    sel = torch.as_tensor(list(rows), dtype=torch.int64, device=raw.device)
    lp = torch.log_softmax(raw[sel].float(), dim=-1)  # [m, vocab]
    tok = torch.as_tensor(list(tokens), dtype=torch.int64, device=raw.device)
    chosen = lp.gather(1, tok[:, None])[:, 0]
    if k:
        top = torch.topk(lp, k, dim=-1)
        values, indices = top.values.cpu().tolist(), top.indices.cpu().tolist()
    else:
        values, indices = [[] for _ in tokens], [[] for _ in tokens]
    out = []
    for j, (t, v) in enumerate(zip(tokens, chosen.cpu().tolist(), strict=True)):
        out.append(TokenLogprob(int(t), float(v), tuple(zip(indices[j], values[j], strict=True))))
    return out
