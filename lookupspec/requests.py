"""The request types of the client API and the service: what to generate, and where it may draft from.

Light on purpose (no torch): ``import lookupspec`` and the gateway client use them without loading a
model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ClientError", "GenerationRequest", "Lookup"]


class ClientError(RuntimeError):
    """A request the server (or the local engine) refused. ``status`` is the HTTP status (0: the
    server could not be reached), ``param`` the offending request parameter when known."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code


@dataclass(frozen=True)
class Lookup:
    """Where a request may draft from (the gateway's ``lookup`` object)."""

    enabled: bool = True
    collections: tuple[str, ...] = ()
    documents: tuple[str, ...] = ()  # inline texts to draft from for this request only
    max_draft_tokens: int | None = None
    sources: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"enabled": self.enabled}
        if self.collections:
            out["collections"] = list(self.collections)
        if self.documents:
            out["documents"] = list(self.documents)
        if self.max_draft_tokens is not None:
            out["max_draft_tokens"] = self.max_draft_tokens
        if self.sources is not None:
            out["sources"] = list(self.sources)
        return out


@dataclass(frozen=True)
class GenerationRequest:
    """One generation: a plain ``prompt`` (completions) or chat ``messages``. ``temperature`` unset
    samples at 1.0, as the HTTP API does; 0 is greedy."""

    prompt: str | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    max_tokens: int = 256
    temperature: float | None = None  # None: 1.0, as in the HTTP API
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    lookup: Lookup = field(default_factory=Lookup)
    # structured outputs, tools, log-probabilities, penalties: OpenAI's fields and values
    # (docs/structured-outputs.md); None: off / the default
    response_format: Mapping[str, Any] | None = None
    tools: Sequence[Mapping[str, Any]] | None = None
    tool_choice: str | Mapping[str, Any] | None = None
    logprobs: int | None = None  # alternatives per token (0: the token's own only)
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: Mapping[str, float] | None = None
    min_tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ClientError("pass exactly one of prompt or messages", param="messages")

    def payload(self, model: str, *, stream: bool) -> dict[str, Any]:
        """The OpenAI-style request body."""
        body: dict[str, Any] = {
            "model": model, "max_tokens": self.max_tokens,
            "top_p": self.top_p, "top_k": self.top_k, "stream": stream, "lookup": self.lookup.to_json(),
        }
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.seed is not None:
            body["seed"] = self.seed
        if self.stop:
            body["stop"] = list(self.stop)
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.messages is not None:
            body["messages"] = [dict(m) for m in self.messages]
        else:
            body["prompt"] = self.prompt
        for name in ("response_format", "frequency_penalty", "presence_penalty", "repetition_penalty",
                     "logit_bias", "min_tokens"):
            value = getattr(self, name)
            if value is not None:
                body[name] = dict(value) if isinstance(value, Mapping) else value
        if self.tools is not None:
            body["tools"] = [dict(t) for t in self.tools]
        if self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        if self.logprobs is not None:
            if self.messages is not None:
                body["logprobs"], body["top_logprobs"] = True, self.logprobs
            else:
                body["logprobs"] = self.logprobs
        return body
