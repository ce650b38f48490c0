"""The documents API: collections of documents a namespace drafts from.

Uploads go through the service (``lookupspec.service.documents``), whose indexes are updated before
the response is sent, so a request that follows the upload drafts from it. Other replicas apply the
same records when they read them from Redis (typically within milliseconds).
Reads come from the store's state and never touch the network. They are rendered with the standard
JSON encoder rather than through the response models (which document them): pydantic's encoder
refuses values nested ~255 levels deep, and a record stored before metadata was bounded
(``protocol.MAX_METADATA_DEPTH``) must still read; see ``_metadata_out``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from lookupspec.service.documents import Document, append
from lookupspec.service.documents import add_documents as add_to_collection
from lookupspec.store import (
    AddDocument,
    DeleteCollection,
    DeleteDocument,
)

from .config import NAME_PATTERN
from .errors import not_found
from .protocol import (
    MAX_METADATA_DEPTH,
    CollectionDeleted,
    CollectionDetail,
    CollectionList,
    DocumentDeleted,
    DocumentDetail,
    DocumentsAdded,
    DocumentsUpload,
    metadata_depth,
)
from .routing import ERRORS, namespace, service_of

__all__ = ["router"]

log = logging.getLogger(__name__)
router = APIRouter()

CollectionName = Annotated[str, Path(pattern=NAME_PATTERN, description="collection name")]
DocumentId = Annotated[str, Path(min_length=1, max_length=256, description="document id")]
Namespace = Annotated[str, Depends(namespace)]


def _metadata_out(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Stored metadata as returned. Within today's bounds as is; deeper (a record from before the
    bound) checked to encode, and replaced by a note only if even the standard encoder cannot
    (nothing the request parser accepted is that deep, so this is a last line of defence)."""
    plain = dict(metadata)
    if metadata_depth(plain) <= MAX_METADATA_DEPTH:
        return plain
    try:
        json.dumps(plain)
    except (RecursionError, ValueError) as exc:
        log.warning("stored metadata cannot be returned: %s", exc)
        return {"_lookupspec_error": "this document's metadata is nested too deep to return"}
    return plain


@router.post("/v1/collections/{name}/documents", response_model=DocumentsAdded,
             responses=ERRORS(400, 401, 413, 503))
async def add_documents(request: Request, name: CollectionName, body: DocumentsUpload, ns: Namespace) -> Any:
    """Add (or replace, by id) a batch of documents; the collection is created on first use."""
    documents = [Document(doc.id, doc.text, doc.metadata) for doc in body.documents]
    records, acks = await run_in_threadpool(add_to_collection, service_of(request), ns, name, documents)
    return JSONResponse({
        "object": "collection.documents",
        "collection": name,
        "added": len(records),
        "documents": [{"id": r.doc_id, "token_count": len(r.tokens), "metadata": _metadata_out(r.metadata)}
                      for r in records if isinstance(r, AddDocument)],
        "buffered": any(a.buffered for a in acks),
    })


@router.get("/v1/collections", response_model=CollectionList, responses=ERRORS(401))
async def list_collections(request: Request, ns: Namespace) -> Any:
    infos = service_of(request).store.state.list_collections(ns)
    return {"object": "list", "data": [{"object": "collection", "name": c.name,
                                        "document_count": c.document_count, "token_count": c.token_count}
                                       for c in infos]}


@router.get("/v1/collections/{name}", response_model=CollectionDetail, responses=ERRORS(400, 401, 404))
async def get_collection(request: Request, name: CollectionName, ns: Namespace) -> Any:
    state = service_of(request).store.state
    info = state.get_collection(ns, name)
    if info is None:
        raise not_found(f"no collection named {name!r}", "name", "collection_not_found")
    docs = state.list_documents(ns, name)
    return JSONResponse({"object": "collection", "name": name, "document_count": info.document_count,
                         "token_count": info.token_count,
                         "documents": [{"id": d.doc_id, "token_count": d.token_count,
                                        "metadata": _metadata_out(d.metadata)} for d in docs]})


@router.get("/v1/collections/{name}/documents/{doc_id:path}", response_model=DocumentDetail,
            responses=ERRORS(400, 401, 404))
async def get_document(request: Request, name: CollectionName, doc_id: DocumentId, ns: Namespace) -> Any:
    doc = service_of(request).store.state.get_document(ns, name, doc_id)
    if doc is None:
        raise not_found(f"no document {doc_id!r} in collection {name!r}", "doc_id", "document_not_found")
    return JSONResponse({"object": "collection.document", "collection": name, "id": doc.doc_id,
                         "token_count": doc.token_count, "metadata": _metadata_out(doc.metadata),
                         "text": doc.text})


@router.delete("/v1/collections/{name}/documents/{doc_id:path}", response_model=DocumentDeleted,
               responses=ERRORS(400, 401, 404, 503))
async def delete_document(request: Request, name: CollectionName, doc_id: DocumentId, ns: Namespace) -> Any:
    service = service_of(request)
    if not service.store.state.has_document(ns, name, doc_id):
        raise not_found(f"no document {doc_id!r} in collection {name!r}", "doc_id", "document_not_found")
    await run_in_threadpool(append, service, [DeleteDocument(ns, name, doc_id)])
    return {"object": "collection.document.deleted", "collection": name, "id": doc_id, "deleted": True}


@router.delete("/v1/collections/{name}", response_model=CollectionDeleted,
               responses=ERRORS(400, 401, 404, 503))
async def delete_collection(request: Request, name: CollectionName, ns: Namespace) -> Any:
    service = service_of(request)
    if service.store.state.get_collection(ns, name) is None:
        raise not_found(f"no collection named {name!r}", "name", "collection_not_found")
    await run_in_threadpool(append, service, [DeleteCollection(ns, name)])
    return {"object": "collection.deleted", "name": name, "deleted": True}
