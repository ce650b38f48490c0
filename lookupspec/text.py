"""Text in, text out: the engine plus a tokenizer, chat templates and stop strings.

A ``TextEngine`` loads a model (``TextEngine.load("smollm2-135m-instruct")``) and turns text into the
engine's token ids and back: prompts and chat templates, sampling parameters, tokenized corpora, and a
``TextFollower`` per generation that turns its steps into text (stop strings included). Generations
run through the service (``lookupspec.service``), from the gateway or ``lookupspec.connect(...)``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lookupspec.config import EngineConfig, ModelConfig
from lookupspec.detokenize import TextStream
from lookupspec.engine import Engine, StepOutput
from lookupspec.models import (
    LoadedModel,
    ModelLoadError,
    check_same_tokenizer,
    eos_token_ids,
    load_model,
    render_chat,
    render_chat_text,
)
from lookupspec.params import GenerationParams, SpecParams
from lookupspec.prompt_bound import PromptBound
from lookupspec.sampling import SamplingParams
from lookupspec.stats import RequestStats

__all__ = ["TextChunk", "TextEngine", "TextFollower"]


@dataclass(frozen=True)
class TextChunk:
    """Text released by one step (may be '' while a stop-string prefix or partial char is held)."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    stats: RequestStats | None = None  # the request's running speculation statistics


class TextFollower:
    """One generation's text as its steps come out: each step's tokens become a text delta (held back
    while it may be the start of a stop string or of a multi-byte character); a stop string ends the
    text with finish_reason "stop" (the caller then stops the generation)."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self._text = TextStream(tokenizer, stop)

    def feed(self, step: StepOutput) -> TextChunk:
        delta = self._text.push(step.tokens)
        if self._text.stop_reached is not None:
            return TextChunk(delta, step.tokens, "stop", step.stats)
        if step.finish_reason is not None:
            delta += self._text.flush()
            if self._text.stop_reached is not None:
                return TextChunk(delta, step.tokens, "stop", step.stats)
        return TextChunk(delta, step.tokens, step.finish_reason, step.stats)


class TextEngine:
    """Holds a loaded model, its tokenizer and an :class:`Engine`."""

    def __init__(self, loaded: LoadedModel, engine: Engine | None = None, config: EngineConfig | None = None,
                 *, draft_model: Any | None = None, spec: SpecParams | None = None) -> None:
        """``engine``: one already built over ``loaded.model``; else one is built from ``config`` (its
        ``context_window`` defaults to the loaded model's) with ``draft_model`` (a loaded model) and
        ``spec`` (the default speculation)."""
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        if engine is None:
            config = config if config is not None else EngineConfig()
            if config.context_window is None:
                config = dataclasses.replace(config, context_window=loaded.context_window)
            engine = Engine(loaded.model, config, draft_model=draft_model, spec=spec)
        self.engine = engine
        self.eos_token_ids = eos_token_ids(loaded)

    @classmethod
    def load(cls, model: str, config: ModelConfig | None = None, engine: EngineConfig | None = None, *,
             spec: SpecParams | None = None, warmup: bool = False,
             log: Callable[[str], None] = print) -> TextEngine:
        """Load a target ``model`` (a named default, a Hugging Face directory or a GGUF file) as
        ``config`` says (:class:`~lookupspec.config.ModelConfig`: dtype, device, the draft model,
        packed linear layers) and build its engine from ``engine``
        (:class:`~lookupspec.config.EngineConfig`); ``spec``: the engine's default speculation;
        ``warmup``: compile the kernels and seed the step-cost model now (:mod:`lookupspec.warmup`)."""
        config = config if config is not None else ModelConfig()
        loaded = load_model(model, dtype=config.dtype, device=config.device, auto_pull=config.auto_pull,
                            weights=config.weights, log=log)
        draft = None
        if config.draft_model:
            from lookupspec.drafting.derived import derive_draft, is_derived_spec

            if is_derived_spec(config.draft_model):
                try:
                    draft = derive_draft(loaded.model, config.draft_model)
                except ValueError as exc:
                    raise ModelLoadError(str(exc)) from exc
            else:
                draft_loaded = load_model(config.draft_model, dtype=config.dtype, device=config.device,
                                          auto_pull=config.auto_pull, weights=config.weights, log=log)
                check_same_tokenizer(loaded.tokenizer, draft_loaded.tokenizer)
                draft = draft_loaded.model
        from lookupspec.runtime import prepare_models

        prepare_models(loaded.model, draft, packed_linear=config.packed_linear)  # after deriving: self:int8
        from lookupspec.runtime import RuntimeUnsupported

        try:
            te = cls(loaded, config=engine, draft_model=draft, spec=spec)
        except RuntimeUnsupported as exc:
            raise ModelLoadError(str(exc)) from exc
        if warmup:
            te.engine.warmup()
        return te

    def encode_prompt(self, prompt: str | None = None, messages: Sequence[dict[str, str]] | None = None,
                      prompt_ids: Sequence[int] | None = None) -> list[int]:
        given = sum(x is not None for x in (prompt, messages, prompt_ids))
        if given != 1:
            raise ValueError("pass exactly one of prompt, messages or prompt_ids")
        if messages is not None:
            return render_chat(self.tokenizer, messages)
        if prompt is not None:
            return list(self.tokenizer.encode(prompt, add_special_tokens=True))
        return [int(t) for t in prompt_ids or ()]

    def chat_text(self, messages: Sequence[dict[str, str]]) -> str:
        """The text ``encode_prompt(messages=...)`` tokenizes (chat template applied)."""
        return render_chat_text(self.tokenizer, messages)

    def encode_text(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Token ids of a prompt text (``add_special_tokens`` False for a rendered chat text)."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    @functools.cached_property
    def prompt_bound(self) -> PromptBound | None:
        """Bytes above which a prompt cannot fit a window (``lookupspec.prompt_bound``); None when
        the tokenizer allows no safe bound."""
        return PromptBound.for_tokenizer(self.tokenizer)

    def corpus_documents(self, docs: Sequence[tuple[str, str]]) -> list[tuple[str, np.ndarray]]:
        """(id, text) pairs tokenized for a :class:`~lookupspec.index.CorpusIndex` (no special tokens)."""
        return [(doc_id, np.asarray(self.tokenizer.encode(text, add_special_tokens=False), dtype=np.int32))
                for doc_id, text in docs]

    def corpus_from_texts(self, texts: Sequence[str]) -> Any:
        """A throw-away CorpusIndex over inline texts (a request's ``lookup.documents``); None if empty."""
        from lookupspec.index import CorpusIndex

        named = [(f"inline-{n}", text) for n, text in enumerate(texts)]
        docs = [(doc_id, ids) for doc_id, ids in self.corpus_documents(named) if len(ids)]
        if not docs:
            return None
        store = CorpusIndex()
        store.add_documents(docs)
        return store

    def params(self, *, max_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
               seed: int | None = None, stop_token_ids: Sequence[int] = (),
               ignore_eos: bool = False) -> GenerationParams:
        return GenerationParams(
            max_tokens=max_tokens,
            sampling=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed),
            stop_token_ids=tuple(stop_token_ids),
            eos_token_ids=self.eos_token_ids,
            ignore_eos=ignore_eos,
        )

    def follower(self, stop: Sequence[str] = ()) -> TextFollower:
        """Turns one generation's steps (from the scheduler) into text chunks."""
        return TextFollower(self.tokenizer, stop)
