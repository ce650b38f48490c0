"""The decode loop. The engine knows only token ids: tokenizers, chat templates, stop strings, HTTP
and Redis live outside it.

``Engine.generate(prompt_ids, params)`` prefills the prompt into a KV cache, then yields one
:class:`StepOutput` per target forward with the tokens that forward produced. In the plain loop every
step yields exactly one token; the speculative loop (which extends this one) yields the accepted
draft tokens plus one recovered or bonus token per step.

Token choice is :func:`lookupspec.sampling.select_tokens`: argmax for greedy, position-keyed Gumbel
noise for sampling, so a seeded request is reproducible bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lookupspec.params import GenerationParams, SpecParams
from lookupspec.sampling import select_tokens
from lookupspec.stats import RequestStats

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


class Engine:
    """Plain (non-speculative) decoding over a Hugging Face causal LM with a KV cache."""

    def __init__(self, model: Any, *, context_window: int | None = None) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        cfg = model.config
        self.vocab_size = int(cfg.vocab_size)
        window = context_window or getattr(cfg, "max_position_embeddings", None) or 2048
        self.context_window = int(window)

    @torch.inference_mode()
    def _forward(self, input_ids: torch.Tensor, cache: Any, logits_to_keep: int = 1) -> torch.Tensor:
        """input_ids: [1, n] -> logits [logits_to_keep, vocab] (float32) for the last positions."""
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True,
                         logits_to_keep=logits_to_keep)
        return out.logits[0].float()

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

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

    def generate(
        self, prompt_ids: Sequence[int], params: GenerationParams, spec: SpecParams | None = None
    ) -> Generator[StepOutput, None, None]:
        """Yield one :class:`StepOutput` per forward until EOS/stop id, max_tokens or the window.
        ``spec`` is accepted for the speculative engine's signature; this loop is always plain."""
        ids = self._check_prompt(prompt_ids)
        sampling = params.sampling if params.sampling.greedy else params.sampling.with_seed()
        stats = RequestStats()
        cache = self.new_cache()
        t0 = time.perf_counter()
        logits = self._forward(ids[None, :], cache)
        stats.prefill_s = time.perf_counter() - t0
        length = ids.shape[0]  # tokens in the cache + 1 pending: position of the next token
        generated = 0
        while True:
            position = torch.tensor([length], dtype=torch.long)
            # .item(): the host needs the token to check the stop conditions and stream it.
            token = int(select_tokens(logits, sampling, position).item())
            kept, reason = finish_tokens([token], generated, params, self.context_window - length)
            generated += len(kept)
            if reason is not None:
                yield StepOutput(tuple(kept), reason, stats=stats)
                return
            yield StepOutput(tuple(kept), None, stats=stats)
            t0 = time.perf_counter()
            logits = self._forward(torch.tensor([[token]], dtype=torch.long, device=self.device), cache)
            stats.observe(draft=0, accepted=0, emitted=1, verify_s=time.perf_counter() - t0)
            length += 1
