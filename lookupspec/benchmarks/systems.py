"""The systems `lookupspec bench` compares: the lookupspec engine and the Hugging Face peers.

Every system turns prompt token ids into a :class:`Run` (greedy, batch 1, at most ``max_tokens``
new tokens, stopping at the model's EOS ids exactly like the others). The lookupspec systems also
take a prompt's logits processing (``LogitsParams``: the grammar of its ``response_format``); the HF
peers cannot constrain their output to a grammar, so `lookupspec bench` does not run them on such
prompts. Timing covers the whole
request: from asking for the first token (prefill included) to receiving the last one.

- ``lookupspec``: :class:`lookupspec.engine.Engine`, built by :func:`build_lookupspec_engine` (the one
  place to adjust when the engine's constructor changes); target forwards come from its statistics.
- ``lookupspec-plain``: the same engine with speculation off, to separate what the packed linear
  layers and the lean forward give from what drafting gives.
- ``lookupspec-hf-forward``: the engine with speculation but transformers' own forward for every
  step (no :mod:`lookupspec.runtime.lean`), to show what the lean forward gives.
- ``hf-greedy``: ``model.generate(do_sample=False)``, the exactness reference.
- ``hf-pld``: prompt lookup decoding, ``generate(prompt_lookup_num_tokens=10)``.
- ``hf-assisted``: assisted generation, ``generate(assistant_model=<the draft model>)``.

The HF peers count target forwards with a forward pre-hook on the target module.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lookupspec.config import EngineConfig
from lookupspec.logits import LogitsParams
from lookupspec.models import LoadedModel
from lookupspec.params import LOOKUP_SOURCES, GenerationParams, SpecParams

__all__ = [
    "HF_SYSTEMS",
    "LOOKUPSPEC_SYSTEMS",
    "SYSTEMS",
    "ForwardCounter",
    "HFSystem",
    "LookupspecSystem",
    "Run",
    "build_lookupspec_engine",
]

HF_SYSTEMS = ("hf-greedy", "hf-pld", "hf-assisted")
LOOKUPSPEC_SYSTEMS = ("lookupspec", "lookupspec-plain", "lookupspec-hf-forward")
SYSTEMS = (*LOOKUPSPEC_SYSTEMS, *HF_SYSTEMS)
PLD_TOKENS = 10  # prompt_lookup_num_tokens for hf-pld (the value the targets refer to)


@dataclass(frozen=True)
class Run:
    """One generation: the new token ids, wall seconds, target forwards (prefill included) and, for
    lookupspec, its ``RequestStats.as_dict()``."""

    tokens: list[int]
    seconds: float
    target_forwards: int
    stats: dict[str, Any] | None = None


class ForwardCounter:
    """Counts calls of a module's forward (a pre-hook: nothing about the call changes)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.count = 0
        self._handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: Any) -> None:
        self.count += 1

    def reset(self) -> None:
        self.count = 0

    def remove(self) -> None:
        self._handle.remove()


def build_lookupspec_engine(target: LoadedModel, draft: LoadedModel | None, *,
                            speculate: bool = True, lean: bool = True,
                            packed_linear: bool = True, cuda_graphs: str = "auto") -> tuple[Any, SpecParams]:
    """The engine and per-request speculation settings a ``lookupspec`` system benchmarks: lookups
    always, the draft model when one is given; the cost model is seeded by a warm-up. The engine
    runs on its own copy of the models with oneDNN-packed linear layers unless ``packed_linear`` is
    false (as ``TextEngine.load`` serves them) and on the lean forward unless ``lean`` is false; the HF
    systems keep the stock model. ``cuda_graphs``: as ``--cuda-graphs``."""
    import copy

    from lookupspec.engine import Engine
    from lookupspec.runtime import prepare_models

    model = copy.deepcopy(target.model)
    draft_model = copy.deepcopy(draft.model) if draft is not None and speculate else None
    prepare_models(model, draft_model, packed_linear=packed_linear)
    engine = Engine(model, EngineConfig(context_window=target.context_window, lean=lean,
                                         cuda_graphs=cuda_graphs),
                    draft_model=draft_model)
    engine.warmup()
    if not speculate:
        return engine, SpecParams(enabled=False)
    spec = SpecParams() if draft is not None else SpecParams(sources=LOOKUP_SOURCES)
    return engine, spec


class LookupspecSystem:
    """``lookupspec``: the engine with speculation; ``lookupspec-plain``: the same engine decoding
    one token per forward (what the packed kernels and the lean forward give, without drafting);
    ``lookupspec-hf-forward``: speculation on transformers' forward."""

    def __init__(self, target: LoadedModel, draft: LoadedModel | None, eos_ids: Sequence[int],
                 name: str = "lookupspec", *, packed_linear: bool = True, lean_forward: bool = True,
                 cuda_graphs: str = "auto") -> None:
        if name not in LOOKUPSPEC_SYSTEMS:
            raise ValueError(f"unknown lookupspec system {name!r}")
        self.name = name
        lean = lean_forward and name != "lookupspec-hf-forward"
        self.engine, self.spec = build_lookupspec_engine(target, draft, speculate=name != "lookupspec-plain",
                                                         lean=lean, packed_linear=packed_linear,
                                                         cuda_graphs=cuda_graphs)
        self.eos_ids = tuple(eos_ids)
        self.uses_draft_model = "draft_model" in self.spec.sources and self.spec.enabled

    @property
    def vocab_size(self) -> int:
        return int(self.engine.vocab_size)

    def generate(self, prompt_ids: Sequence[int], max_tokens: int, logits: LogitsParams | None = None) -> Run:
        params = GenerationParams(max_tokens=max_tokens, eos_token_ids=self.eos_ids,
                                  logits=logits if logits is not None else LogitsParams())
        tokens: list[int] = []
        stats = None
        with torch.inference_mode():
            start = time.perf_counter()
            for step in self.engine.generate(prompt_ids, params, spec=self.spec):
                tokens.extend(step.tokens)
                stats = step.stats
            seconds = time.perf_counter() - start
        if stats is None:
            raise RuntimeError("the engine produced no step")
        return Run(tokens, seconds, int(stats.target_forwards), stats.as_dict())


class HFSystem:
    """A Hugging Face ``generate`` configuration on the shared target model."""

    def __init__(self, name: str, target: LoadedModel, eos_ids: Sequence[int], counter: ForwardCounter,
                 draft: LoadedModel | None = None) -> None:
        if name not in HF_SYSTEMS:
            raise ValueError(f"unknown HF system {name!r}")
        if name == "hf-assisted" and draft is None:
            raise ValueError("hf-assisted needs a draft model")
        self.name = name
        self.model = target.model
        self.device = target.device
        self.counter = counter
        self.eos_ids = list(eos_ids)
        # pad_token_id only silences generate's "setting pad_token_id" notice: batch 1 never pads.
        pad = target.tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_ids[0]
        self.extra: dict[str, Any] = {}
        if name == "hf-pld":
            self.extra["prompt_lookup_num_tokens"] = PLD_TOKENS
        elif name == "hf-assisted":
            assert draft is not None
            self.extra["assistant_model"] = draft.model

    def generate(self, prompt_ids: Sequence[int], max_tokens: int) -> Run:
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)  # [1, prompt]
        # An explicit all-ones mask: SmolLM2's pad id is <|im_end|>, which every chat prompt contains;
        # without the mask generate would infer one that hides those prompt tokens.
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            self.counter.reset()
            start = time.perf_counter()
            out = self.model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_tokens,
                                      eos_token_id=self.eos_ids, pad_token_id=self.pad_id, **self.extra)
            tokens = out[0, ids.shape[1]:].tolist()  # .tolist() syncs a GPU, so the timing is complete
            seconds = time.perf_counter() - start
        return Run([int(t) for t in tokens], seconds, self.counter.count)
