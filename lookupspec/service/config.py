"""The service's configuration: small frozen dataclasses, validated where they are built.

``ServiceConfig`` is what the generation service needs, whichever front end runs it (the gateway's
``GatewayConfig`` extends it with the HTTP side); ``Limits`` bounds what one request may ask for
(refused with 400 or 413 before any model work starts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["DEFAULT_NAMESPACE", "NAME_PATTERN", "Limits", "ServiceConfig"]

DEFAULT_NAMESPACE = "default"
# Collection and namespace names: safe in URLs, Redis keys and log lines.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
NAME = re.compile(NAME_PATTERN)


@dataclass(frozen=True)
class Limits:
    """Per-request bounds. Sizes are UTF-8 bytes; a request over a size limit gets 413."""

    max_body_bytes: int = 16 * 1024 * 1024  # any request body
    max_documents_per_request: int = 1000  # one documents upload
    max_document_bytes: int = 2 * 1024 * 1024  # one document's text
    max_inline_documents: int = 16  # ``lookup.documents`` of one generation request
    max_inline_bytes: int = 4 * 1024 * 1024  # all inline documents of one request together
    max_choices: int = 16  # prompts x n of one request
    body_timeout_s: float = 30.0  # a request body that sends nothing for this long gets 408

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_documents_per_request", "max_document_bytes",
                     "max_inline_documents", "max_inline_bytes", "max_choices"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.body_timeout_s > 0:
            raise ValueError(f"body_timeout_s must be > 0, got {self.body_timeout_s}")


@dataclass(frozen=True)
class ServiceConfig:
    """model_name: the id clients send as ``model`` (``/v1/models`` lists it).
    max_queue: requests that may wait for a slot while ``max_batch`` sequences run; one more gets 429.
    max_batch: sequences generating at once (a request with ``n`` choices takes ``n``).
    max_batch_tokens: rows one step may have, prefill chunk included (None: no cap beyond the draft
    budget the drafting policy chooses).
    prefill_stretch: while sequences decode, a forward carrying a prompt chunk may take about this
    many times a plain step of the batch (``lookupspec.cost.chunk``; 0: whole prefill chunks always).
    request_timeout_s: deadline of one generation request, queueing included.
    max_model_len: caps the context window below the model's (None: the model's own).
    output_cap_tokens: size of each namespace's output index (lookup index of earlier outputs).
    trace_iterations: a file to append one JSON line per scheduler iteration to
    (``lookupspec.iteration_trace``; None: no trace).
    """

    model_name: str
    max_queue: int = 64
    max_batch: int = 16
    max_batch_tokens: int | None = None
    prefill_stretch: float = 2.5
    request_timeout_s: float = 600.0
    max_model_len: int | None = None
    output_cap_tokens: int = 1_000_000
    limits: Limits = field(default_factory=Limits)
    trace_iterations: str | None = None

    def __post_init__(self) -> None:
        if not self.model_name:
            raise ValueError("model_name must not be empty")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_batch_tokens is not None and self.max_batch_tokens < self.max_batch:
            raise ValueError(f"max_batch_tokens ({self.max_batch_tokens}) must be >= max_batch "
                             f"({self.max_batch})")
        if not (self.prefill_stretch == 0 or self.prefill_stretch > 1):
            raise ValueError(f"prefill_stretch must be 0 (off) or > 1, got {self.prefill_stretch}")
        if not self.request_timeout_s > 0:
            raise ValueError("request_timeout_s must be > 0")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.output_cap_tokens < 1:
            raise ValueError(f"output_cap_tokens must be >= 1, got {self.output_cap_tokens}")
