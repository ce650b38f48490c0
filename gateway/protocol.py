"""Every request and response body of the HTTP API (pydantic lives here and nowhere else).

Requests follow OpenAI's field names and types, strictly: ``"stream": "yes"`` or ``"max_tokens": true``
is a 400, not coerced. ``null`` for an optional field means its default (OpenAI's schema allows it).
OpenAI fields that ask for behaviour this server does not have (``echo``, ``best_of`` > 1, audio, ...)
are declared here so that a request that *uses* one gets a 400 naming it, while their default or
empty values, which clients send routinely, are accepted. Structured outputs (``response_format``),
tools, log-probabilities, penalties, ``logit_bias`` and ``min_tokens`` are served
(``docs/structured-outputs.md``). Fields we do not know at all are accepted
(``extra="allow"``) and logged by the routes. Two extensions: the request's ``lookup`` object (what
this request may draft from) and the response's ``speculation`` object (how drafting went).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from lookupspec.params import ALL_SOURCES, MAX_DRAFT_TOKENS

from .config import NAME_PATTERN

__all__ = [
    "MAX_METADATA_BYTES",
    "MAX_METADATA_DEPTH",
    "ChatChoice",
    "ChatChunk",
    "ChatChunkChoice",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatDelta",
    "ChatMessage",
    "ChatMessageOut",
    "CollectionDeleted",
    "CollectionDetail",
    "CollectionList",
    "CollectionSummary",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionChunkChoice",
    "CompletionRequest",
    "CompletionResponse",
    "ContentPart",
    "DocumentDeleted",
    "DocumentDetail",
    "DocumentIn",
    "DocumentSummary",
    "DocumentsAdded",
    "DocumentsUpload",
    "ErrorDetail",
    "ErrorResponse",
    "LookupOptions",
    "ModelCard",
    "ModelList",
    "ResponseFormat",
    "ResponseFormatSchema",
    "Speculation",
    "StreamOptions",
    "Tool",
    "ToolCall",
    "Usage",
    "metadata_depth",
]



def _utf8(value: str) -> str:
    # JSON may carry lone surrogates ("\ud800"); they cannot be tokenized or stored: a 400, not a 500.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    return value


Text = Annotated[str, AfterValidator(_utf8)]
Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
def _addressable(value: str) -> str:
    # A document is read and deleted at /v1/collections/{name}/documents/{id}: an id with a "." or
    # ".." path segment would be normalized away by clients (RFC 3986), leaving a record no request
    # can reach.
    if any(part in (".", "..") for part in value.split("/")):
        raise ValueError('must not contain "." or ".." path segments (the id is part of a URL)')
    return value


DocId = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$"),
                  AfterValidator(_addressable)]
StopString = Annotated[str, StringConstraints(min_length=1, max_length=1000)]
Source = Literal["context", "corpus", "output", "draft_model"]
assert set(Source.__args__) == set(ALL_SOURCES)  # type: ignore[attr-defined]

_OPEN = ConfigDict(extra="allow")
_CLOSED = ConfigDict(extra="forbid")
MAX_STOP = 16


def _stop_count(value: Any) -> Any:
    # Checked before the str | list union, so too many is reported as such, not as "not a string".
    if isinstance(value, list) and len(value) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop sequences, got {len(value)}")
    return value


class _NullIsDefault(BaseModel):
    """``null`` for an optional field means its default, also where the default is not ``None``
    (``max_tokens`` 16 on completions, ``lookup.enabled`` true, ``metadata`` {}): such nulls are
    dropped before validation, so a null and an omitted field are one and the same request."""

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        defaulted = [name for name, f in cls.model_fields.items()
                     if not f.is_required() and f.get_default(call_default_factory=True) is not None]
        if not any(data.get(name, 0) is None for name in defaulted):
            return data
        return {k: v for k, v in data.items() if not (v is None and k in defaulted)}


# ---- requests -----------------------------------------------------------------------------------


class LookupOptions(_NullIsDefault):
    """Extension: where this request may draft from. Omitted: every source, no collections."""

    model_config = _CLOSED
    enabled: bool = Field(default=True, strict=True,
                          description="False: plain decoding (same tokens, no drafting)")
    collections: list[Name] = Field(default_factory=list, max_length=64,
                                    description="document collections of this namespace to draft from")
    documents: list[Text] = Field(default_factory=list,
                                 description="inline texts to draft from for this request only")
    max_draft_tokens: int | None = Field(default=None, ge=0, le=MAX_DRAFT_TOKENS, strict=True,
                                         description="cap on draft tokens per step")
    sources: list[Source] | None = Field(default=None,
                                         description="drafters this request may use (default: all)")


class StreamOptions(BaseModel):
    model_config = _OPEN
    include_usage: bool | None = Field(default=None, strict=True, description="null: false")


def _unsupported(what: str, allowed: Callable[[Any], bool], accepted: str) -> Any:
    """An after-validator refusing values that ask for behaviour this server lacks: '<what> is not
    supported by this server; send <accepted> or omit the field'."""

    def check(value: Any) -> Any:
        if value is not None and not allowed(value):
            raise ValueError(f"{what} is not supported by this server; send {accepted} or omit the field")
        return value

    return AfterValidator(check)


Penalty = Annotated[float | None, Field(default=None, strict=True, ge=-2.0, le=2.0, description="null: 0")]


class ResponseFormatSchema(BaseModel):
    """``response_format.json_schema``: OpenAI's shape (``name``, ``schema``, ``strict``)."""

    model_config = _OPEN
    name: str = Field(default="response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema",
                                           description="the JSON schema the output must validate against")
    strict: bool | None = Field(default=None, strict=True, description="null: false")


class ResponseFormat(BaseModel):
    """``text`` (default), ``json_object`` (any JSON object) or ``json_schema``."""

    model_config = _OPEN
    type: Literal["text", "json_object", "json_schema"]
    json_schema: ResponseFormatSchema | None = None


class _GenerationFields(_NullIsDefault):
    """Fields both endpoints share. ``None`` means the documented default (see ``description``)."""

    model_config = _OPEN
    model: str = Field(..., description="the served model's id (see GET /v1/models)")
    max_tokens: int | None = Field(default=None, ge=1, le=2**31 - 1, strict=True)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, strict=True, description="null: 1.0")
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, strict=True, description="null: 1.0")
    top_k: int | None = Field(default=None, ge=-1, le=2**31 - 1, strict=True, description="0, -1, null: off")
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1, strict=True)
    stop: Annotated[StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)] | None,
                    BeforeValidator(_stop_count)] = Field(
        None, description=f"up to {MAX_STOP} strings; the text is cut before the first one found")
    n: int | None = Field(default=None, ge=1, le=16, strict=True, description="null: 1")
    stream: bool | None = Field(default=None, strict=True, description="null: false")
    stream_options: StreamOptions | None = None
    user: Text | None = None
    lookup: LookupOptions | None = None
    logit_bias: dict[str, float] | None = Field(
        default=None, description="token id (as a string) -> bias in [-100, 100] added to its logit")
    frequency_penalty: Penalty = None
    presence_penalty: Penalty = None
    repetition_penalty: float | None = Field(default=None, strict=True, gt=0.0, le=2.0,
                                             description="vLLM's extension; null: 1 (off)")
    min_tokens: int | None = Field(default=None, ge=0, le=2**31 - 1, strict=True,
                                   description="vLLM's extension: end tokens refused before this many")
    response_format: ResponseFormat | None = None


class CompletionRequest(_GenerationFields):
    prompt: (Text | list[Text] | list[Annotated[int, Field(ge=0, strict=True)]]
             | list[list[Annotated[int, Field(ge=0, strict=True)]]]) = Field(
        ..., description="text, a batch of texts, token ids, or a batch of token-id lists")
    max_tokens: int | None = Field(default=16, ge=1, le=2**31 - 1, strict=True)
    echo: Annotated[bool | None, Field(default=None, strict=True, json_schema_extra={"enum": [False, None]}),
                    _unsupported("echo", lambda v: v is False, "false")]
    best_of: Annotated[int | None, Field(default=None, strict=True, ge=1, le=2**31 - 1,
                                         json_schema_extra={"maximum": 1}),
                       _unsupported("best_of > 1", lambda v: v <= 1, "1")]
    logprobs: int | None = Field(default=None, strict=True, ge=0, le=20,
                                 description="the log-probability of each token and this many alternatives")
    suffix: Annotated[str | None, Field(default=None, json_schema_extra={"maxLength": 0}),
                      _unsupported("suffix", lambda v: v == "", '""')]


class ContentPart(BaseModel):
    model_config = _OPEN
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = _OPEN
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentPart] | None = None
    name: Text | None = None


class ToolFunction(BaseModel):
    model_config = _OPEN
    name: Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="a JSON schema; null: no arguments")
    strict: bool | None = None


class Tool(BaseModel):
    model_config = _OPEN
    type: Literal["function"]
    function: ToolFunction


class NamedToolChoice(BaseModel):
    model_config = _OPEN
    type: Literal["function"]
    function: dict[str, str]


def _no_functions(value: Any) -> bool:
    return value in ("none", "auto")


class ChatCompletionRequest(_GenerationFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=2**31 - 1, strict=True,
                                              description="preferred over max_tokens")
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        default=None, description='null: "auto" with tools, "none" without')
    parallel_tool_calls: bool | None = Field(default=None, strict=True, description="accepted, unused")
    functions: Annotated[list[dict[str, Any]] | None, Field(default=None, json_schema_extra={"maxItems": 0}),
                         _unsupported("function calling (functions); use tools", lambda v: not v, "[]")]
    function_call: Annotated[str | dict[str, Any] | None, Field(default=None),
                             _unsupported("function calling (function_call); use tool_choice", _no_functions,
                                          '"none"')]
    logprobs: bool | None = Field(default=None, strict=True, description="null: false")
    top_logprobs: int | None = Field(default=None, strict=True, ge=0, le=20,
                                     description="alternatives per token; needs logprobs: true")
    audio: Annotated[dict[str, Any] | None, Field(default=None, json_schema_extra={"type": "null"}),
                     _unsupported("audio output", lambda v: False, "null")]
    modalities: Annotated[list[str] | None, Field(default=None),
                          _unsupported("an output modality other than text", lambda v: set(v) <= {"text"},
                                       '["text"]')]


# Stored metadata is bounded so that every stored record can be read back (the response encoder has
# a nesting limit of its own, ~255) and a collection listing stays small.
MAX_METADATA_DEPTH = 32  # {"a": {"b": 1}} has depth 2
MAX_METADATA_BYTES = 64 * 1024  # as compact JSON (UTF-8)


def metadata_depth(value: Any) -> int:
    """Nesting depth of a JSON value ({"a": {"b": 1}}: 2; a scalar: 0), iteratively (a recursive walk
    could hit Python's recursion limit on exactly the hostile inputs this guards against); it stops
    counting once past ``MAX_METADATA_DEPTH``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level > MAX_METADATA_DEPTH:
            break  # deep enough to refuse; no need to walk the rest
        stack.extend((child, level + 1) for child in children)
    return deepest


class DocumentIn(_NullIsDefault):
    model_config = _CLOSED
    id: DocId
    text: Text
    metadata: dict[str, Any] = Field(default_factory=dict, description=(
        f"any JSON object, nested at most {MAX_METADATA_DEPTH} levels, at most {MAX_METADATA_BYTES} "
        "bytes as JSON"))

    @field_validator("metadata")
    @classmethod
    def _storable(cls, value: dict[str, Any]) -> dict[str, Any]:
        depth = metadata_depth(value)
        if depth > MAX_METADATA_DEPTH:
            raise ValueError(f"must be nested at most {MAX_METADATA_DEPTH} levels deep")
        try:  # stored as JSON text: no NaN / Infinity, no lone surrogates
            size = len(json.dumps(value, allow_nan=False, ensure_ascii=False,
                                  separators=(",", ":")).encode("utf-8"))
        except (ValueError, UnicodeEncodeError):
            raise ValueError("must be JSON without NaN, Infinity or lone surrogates") from None
        if size > MAX_METADATA_BYTES:
            raise ValueError(f"must be at most {MAX_METADATA_BYTES} bytes as JSON, got {size}")
        return value


class DocumentsUpload(BaseModel):
    model_config = _CLOSED
    documents: list[DocumentIn] = Field(..., min_length=1)


# ---- responses ----------------------------------------------------------------------------------


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens served from the prefix cache (not prefilled again)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class Speculation(BaseModel):
    """How drafting went (vocabulary of ``lookupspec.verify``): a *step* is one target forward after
    the prefill; ``acceptance_length`` is the mean of accepted + 1 per step; ``source_shares`` is the
    share of accepted draft tokens each drafter proposed."""

    steps: int
    draft_steps: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_length: float
    accepted_per_position: list[int]
    draft_tokens_by_source: dict[str, int]
    accepted_tokens_by_source: dict[str, int]
    source_shares: dict[str, float]


FinishReason = Literal["stop", "length", "tool_calls"]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: FinishReason


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    speculation: Speculation


class ToolCallFunction(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: dict[str, Any] | None = None
    finish_reason: FinishReason


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    speculation: Speculation


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: FinishReason | None = None


class CompletionChunk(BaseModel):
    """One SSE event of a streamed completion (``data: {json}``)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None
    speculation: Speculation | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # OpenAI's streamed shape: index, id, type, function


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: dict[str, Any] | None = None
    finish_reason: FinishReason | None = None


class ChatChunk(BaseModel):
    """One SSE event of a streamed chat completion (``data: {json}``)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    speculation: Speculation | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "lookupspec"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class DocumentSummary(BaseModel):
    id: str
    token_count: int
    metadata: dict[str, Any] = Field(default_factory=dict)


class DocumentDetail(DocumentSummary):
    object: Literal["collection.document"] = "collection.document"
    collection: str
    text: str


class DocumentsAdded(BaseModel):
    object: Literal["collection.documents"] = "collection.documents"
    collection: str
    added: int
    documents: list[DocumentSummary]
    buffered: bool = Field(description="True when the shared store is unreachable and the write is "
                                       "held in this replica's buffer until it returns")


class CollectionSummary(BaseModel):
    object: Literal["collection"] = "collection"
    name: str
    document_count: int
    token_count: int


class CollectionDetail(CollectionSummary):
    documents: list[DocumentSummary]


class CollectionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[CollectionSummary]


class DocumentDeleted(BaseModel):
    object: Literal["collection.document.deleted"] = "collection.document.deleted"
    collection: str
    id: str
    deleted: bool


class CollectionDeleted(BaseModel):
    object: Literal["collection.deleted"] = "collection.deleted"
    name: str
    deleted: bool


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail
