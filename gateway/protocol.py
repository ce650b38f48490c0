"""Every request and response body of the HTTP API (pydantic lives here and nowhere else).

Requests follow OpenAI's field names; fields we do not know are accepted (``extra="allow"``) and
logged by the routes. Two extensions: the request's ``lookup`` object (what this request may draft
from) and the response's ``speculation`` object (how drafting went).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, field_validator

from lookupspec.params import ALL_SOURCES

from .config import NAME_PATTERN

__all__ = [
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
    "Speculation",
    "StreamOptions",
    "Usage",
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
DocId = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]
StopString = Annotated[str, StringConstraints(min_length=1, max_length=1000)]
Source = Literal["context", "corpus", "output", "draft_model"]
assert set(Source.__args__) == set(ALL_SOURCES)  # type: ignore[attr-defined]

_OPEN = ConfigDict(extra="allow")
_CLOSED = ConfigDict(extra="forbid")


# ---- requests -----------------------------------------------------------------------------------


class LookupOptions(BaseModel):
    """Extension: where this request may draft from. Omitted: every source, no collections."""

    model_config = _CLOSED
    enabled: bool = Field(default=True, description="False: plain decoding (same tokens, no drafting)")
    collections: list[Name] = Field(default_factory=list, max_length=64,
                                    description="document collections of this namespace to draft from")
    documents: list[Text] = Field(default_factory=list,
                                 description="inline texts to draft from for this request only")
    max_draft_tokens: int | None = Field(default=None, ge=0, le=256,
                                         description="cap on draft tokens per step")
    sources: list[Source] | None = Field(default=None,
                                         description="drafters this request may use (default: all)")


class StreamOptions(BaseModel):
    model_config = _OPEN
    include_usage: bool = False


class _GenerationFields(BaseModel):
    """Fields both endpoints share."""

    model_config = _OPEN
    model: str = Field(..., description="the served model's id (see GET /v1/models)")
    max_tokens: int | None = Field(default=None, ge=1, le=2**31 - 1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1, le=2**31 - 1, description="0 or -1: off")
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: StopString | Annotated[list[StopString], Field(max_length=16)] | None = Field(
        None, description="up to 16 strings; the text is cut before the first one found")
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    lookup: LookupOptions | None = None


class CompletionRequest(_GenerationFields):
    prompt: (Text | list[Text] | list[Annotated[int, Field(ge=0)]]
             | list[list[Annotated[int, Field(ge=0)]]]) = Field(
        ..., description="text, a batch of texts, token ids, or a batch of token-id lists")
    max_tokens: int | None = Field(default=16, ge=1, le=2**31 - 1)


class ContentPart(BaseModel):
    model_config = _OPEN
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    model_config = _OPEN
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_GenerationFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=2**31 - 1,
                                              description="preferred over max_tokens")


class DocumentIn(BaseModel):
    model_config = _CLOSED
    id: DocId
    text: Text
    metadata: dict[str, Any] = Field(default_factory=dict, description="any JSON object")

    @field_validator("metadata")
    @classmethod
    def _storable(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:  # stored as JSON text: no NaN / Infinity, no lone surrogates
            json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
        except (ValueError, UnicodeEncodeError):
            raise ValueError("must be JSON without NaN, Infinity or lone surrogates") from None
        return value


class DocumentsUpload(BaseModel):
    model_config = _CLOSED
    documents: list[DocumentIn] = Field(..., min_length=1)


# ---- responses ----------------------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


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


FinishReason = Literal["stop", "length"]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None = None
    finish_reason: FinishReason


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    speculation: Speculation


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: None = None
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
    logprobs: None = None
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


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: None = None
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
