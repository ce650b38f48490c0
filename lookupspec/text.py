"""Text in, text out: the engine plus a tokenizer, chat templates and stop strings.

A ``TextEngine`` loads a model (``TextEngine.load("smollm2-135m-instruct")``) and turns text into the
engine's token ids and back: prompts and chat templates, sampling parameters, tokenized corpora, and a
``TextFollower`` per generation that turns its steps into text (stop strings included). Generations
run through the service (``lookupspec.service``), from the gateway or ``lookupspec.connect(...)``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

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
from lookupspec.params import GenerationParams
from lookupspec.prompt_bound import PromptBound
from lookupspec.sampling import SamplingParams
from lookupspec.stats import RequestStats

__all__ = ["TextChunk", "TextEngine", "TextFollower"]

_ENGINE_OPTIONS = ("max_slots", "kv_cache_bytes", "prefill_chunk", "prefix_cache_bytes", "prefix_block_size",
                   "spec")


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

    def __init__(self, loaded: LoadedModel, engine: Engine | None = None, **engine_kwargs: Any) -> None:
        self.loaded = loaded
        self.tokenizer = loaded.tokenizer
        self.engine = engine or Engine(loaded.model, context_window=loaded.context_window, **engine_kwargs)
        self.eos_token_ids = eos_token_ids(loaded)

    @classmethod
    def load(cls, model: str, *, draft_model: str | None = None, dtype: str = "float32", device: str = "cpu",
             auto_pull: bool = False, warmup: bool = False, packed_linear: bool = True,
             lean_forward: bool = True, **kwargs: Any) -> TextEngine:
        """Load a target (and optionally a draft model: a model spec sharing the target's tokenizer, or
        ``self:layers=K`` / ``self:int8`` derived from the target). ``packed_linear``: on CPU in
        float32, run the linear layers on oneDNN-prepacked weights (:mod:`lookupspec.runtime.cpu_linear`;
        1.5-3x faster decoding, same arithmetic up to summation order). ``lean_forward``: decode
        through :mod:`lookupspec.runtime.lean` where the model allows it (bit-identical, faster).
        Other keyword arguments go to :class:`~lookupspec.engine.Engine` when it takes them
        (``max_slots``, ``kv_cache_bytes``, ``prefill_chunk``, ``prefix_cache_bytes``,
        ``prefix_block_size``), else to
        ``load_model``."""
        engine_kwargs = {k: kwargs.pop(k) for k in _ENGINE_OPTIONS if k in kwargs}
        loaded = load_model(model, dtype=dtype, device=device, auto_pull=auto_pull, **kwargs)
        draft = None
        if draft_model:
            from lookupspec.drafting.derived import derive_draft, is_derived_spec

            if is_derived_spec(draft_model):
                try:
                    draft = derive_draft(loaded.model, draft_model)
                except ValueError as exc:
                    raise ModelLoadError(str(exc)) from exc
            else:
                draft_loaded = load_model(draft_model, dtype=dtype, device=device, auto_pull=auto_pull,
                                          **kwargs)
                check_same_tokenizer(loaded.tokenizer, draft_loaded.tokenizer)
                draft = draft_loaded.model
        from lookupspec.runtime import prepare_models

        prepare_models(loaded.model, draft, packed_linear=packed_linear)  # after deriving: self:int8
        from lookupspec.runtime import RuntimeUnsupported

        try:
            te = cls(loaded, draft_model=draft, lean=lean_forward, **engine_kwargs)
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
