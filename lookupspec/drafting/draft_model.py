"""The model-based fallback: a small causal LM (sharing the target's tokenizer) drafts a chain.

The draft model keeps its own KV cache of the request's context. It lags behind whenever a step used
a lookup draft instead, so :meth:`DraftModelDrafter.propose` first syncs: it keeps the longest prefix
of its cache that still agrees with the context and feeds the rest in one forward, then decodes ``k``
tokens one forward each. Greedy drafts are deterministic (verified with greedy or sample-and-match
rules); with ``sample=True`` it draws each token from its own distribution with noise keyed by
(seed, position) on the draft stream and returns those distributions, for rejection sampling.

Example: context [a, b, c] with cache [a, b, x] (x was a rejected draft): the cache is cut to [a, b],
c is fed, then k tokens are drafted after c.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lookupspec.hf_compat import with_cache
from lookupspec.runtime.attention import unplanned_sdpa
from lookupspec.runtime.kvcache import KVCache
from lookupspec.sampling import (
    STREAM_DRAFT,
    SamplingParams,
    exponential_from_keys,
    process_logits,
    stream_keys,
)

__all__ = ["DraftChain", "DraftModelDrafter"]


@dataclass(frozen=True)
class DraftChain:
    tokens: list[int]
    probs: torch.Tensor | None  # [k, vocab] float32 when sampled, else None
    seconds: float


class DraftModelDrafter:
    """One per request (it holds that request's draft KV cache)."""

    name = "draft_model"

    def __init__(self, model: Any, *, capacity: int = 512) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = KVCache.for_model(model, capacity=capacity)
        self.cached: list[int] = []  # tokens whose entries are in self.cache, in order

    @torch.inference_mode()
    def _forward(self, tokens: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        kv = with_cache(self.model, self.cache)
        with unplanned_sdpa(self.device):  # a new cache length at every call: no per-shape cuDNN graphs
            out = self.model(input_ids=ids, **kv, use_cache=True, logits_to_keep=1)
        self.cached.extend(int(t) for t in tokens)
        return out.logits[0, -1].float()  # [vocab]

    def _sync(self, context: Sequence[int]) -> torch.Tensor:
        """Make the cache hold context[:-1] plus context[-1] fed: returns logits after the context."""
        keep = 0
        limit = min(len(self.cached), len(context) - 1)  # always re-feed at least the last token
        while keep < limit and self.cached[keep] == context[keep]:
            keep += 1
        if keep < len(self.cached):
            self.cache.truncate(keep)
            del self.cached[keep:]
        return self._forward(context[keep:])

    def propose(self, context: Sequence[int], k: int, sampling: SamplingParams | None = None,
                sample: bool = False) -> DraftChain:
        """Draft ``k`` tokens after ``context`` (the prompt and every token emitted so far)."""
        t0 = time.perf_counter()
        logits = self._sync(context)
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        position = len(context)  # absolute position of the first drafted token
        for i in range(k):
            if sample and sampling is not None and not sampling.greedy and sampling.seed is not None:
                scores = process_logits(logits[None, :], sampling)  # [1, vocab]
                p = torch.softmax(scores, dim=-1)[0]
                # on the model's device: the noise meets p there (CPU tensors here crashed on CUDA)
                keys = stream_keys(torch.tensor([sampling.seed], dtype=torch.int64, device=self.device),
                                   torch.tensor([position + i], dtype=torch.int64, device=self.device),
                                   STREAM_DRAFT)
                e = exponential_from_keys(keys, p.shape[-1])[0]
                tok = int(torch.argmax(p / e).item())
                probs.append(p)
            else:
                tok = int(torch.argmax(logits).item())
            tokens.append(tok)
            if i + 1 < k:
                logits = self._forward([tok])
        return DraftChain(tokens, torch.stack(probs) if probs else None, time.perf_counter() - t0)
