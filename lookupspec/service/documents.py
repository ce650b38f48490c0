"""Adding documents to a namespace's collections, for both front ends.

Writes go through the store (one record per document, one batch per upload: one fsync or one Redis
round trip); the store applies them to its state, whose hooks update this process's indexes before
``add_documents`` returns, so a request that follows the upload drafts from it. Re-adding an id
replaces that document.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lookupspec.store import AddDocument, AppendAck, BufferFullError, Record, StoreError

from .errors import ServiceError, bad_request, too_large
from .service import Service

__all__ = ["Document", "add_documents", "append"]


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


def _check(service: Service, documents: Sequence[Document]) -> None:
    limits = service.config.limits
    if len(documents) > limits.max_documents_per_request:
        raise too_large(f"at most {limits.max_documents_per_request} documents per request", "documents")
    seen: set[str] = set()
    for i, doc in enumerate(documents):
        if len(doc.text.encode()) > limits.max_document_bytes:
            raise too_large(f"document {doc.id!r} is over the limit of {limits.max_document_bytes} bytes",
                            f"documents[{i}].text")
        if doc.id in seen:
            raise bad_request(f"document id {doc.id!r} appears twice in this batch", f"documents[{i}].id")
        seen.add(doc.id)


def add_documents(service: Service, namespace: str, collection: str,
                  documents: Sequence[Document]) -> tuple[list[AddDocument], list[AppendAck]]:
    """Tokenize and append ``documents`` (blocking: run it off the event loop). Raises
    ``ServiceError``: 400/413 for a bad batch, 503 when the store cannot take the write."""
    _check(service, documents)
    tokenized = service.text_engine.corpus_documents([(doc.id, doc.text) for doc in documents])
    records = [AddDocument(namespace, collection, doc.id, doc.text, ids, dict(doc.metadata))
               for doc, (_, ids) in zip(documents, tokenized, strict=True)]
    return records, append(service, records)


def append(service: Service, records: Sequence[Record]) -> list[AppendAck]:
    """Append ``records`` to the store in one batch; 503 when it cannot take them."""
    try:
        return service.store.append_many(records)
    except BufferFullError as exc:
        raise ServiceError(503, f"the shared store is unreachable and this replica's write buffer is full: "
                                f"{exc}", code="store_unavailable", headers={"Retry-After": "5"}) from None
    except StoreError as exc:
        raise ServiceError(503, f"the shared store rejected the write: {exc}", code="store_unavailable",
                           headers={"Retry-After": "5"}) from None
