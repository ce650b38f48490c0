"""Plain generations for the tests to compare against: the engine's own batch-of-one loop
(``Engine.generate``), without the service, the scheduler or speculation across requests."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from lookupspec.params import LookupScope, SpecParams
from lookupspec.stats import RequestStats
from lookupspec.text import TextChunk, TextEngine

__all__ = ["Completion", "complete", "stream"]


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    stats: RequestStats | None = None
    completion_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.completion_tokens = len(self.token_ids)


def stream(te: TextEngine, *, prompt: str | None = None, messages: Sequence[dict[str, str]] | None = None,
           prompt_ids: Sequence[int] | None = None, stop: Sequence[str] = (), spec: SpecParams | None = None,
           scope: LookupScope | None = None, **kwargs: Any) -> Iterator[TextChunk]:
    """Text chunks of one generation as its steps complete; a stop string ends it."""
    ids = te.encode_prompt(prompt, messages, prompt_ids)
    follow = te.follower(stop)
    gen = te.engine.generate(ids, te.params(**kwargs), spec=spec, scope=scope)
    try:
        for step in gen:
            chunk = follow.feed(step)
            yield chunk
            if chunk.finish_reason is not None:
                return
    finally:
        gen.close()


def complete(te: TextEngine, *, prompt: str | None = None, messages: Sequence[dict[str, str]] | None = None,
             prompt_ids: Sequence[int] | None = None, **kwargs: Any) -> Completion:
    """One whole generation (``stream``'s chunks joined)."""
    ids = te.encode_prompt(prompt, messages, prompt_ids)
    parts: list[str] = []
    tokens: list[int] = []
    reason = "length"
    stats = None
    for chunk in stream(te, prompt_ids=ids, **kwargs):
        parts.append(chunk.text)
        tokens.extend(chunk.token_ids)
        stats = chunk.stats
        if chunk.finish_reason is not None:
            reason = chunk.finish_reason
    return Completion("".join(parts), tokens, reason, prompt_tokens=len(ids), stats=stats)
