"""The in-memory state the log builds: namespaces -> collections -> documents, and per-namespace
output logs; the listener hooks through which index owners follow it.

Convergence. Replicas apply the same records in different orders (a Redis replica applies its own
appends at once, before they reach the stream), so ``apply`` is order-independent: it is a
last-writer-wins set keyed by each record's ``(stamp, record_id)`` (see ``records.HybridClock``):

- a document is live iff its newest add is newer than every delete of it and of its collection;
- a collection exists iff its newest add (of any document) is newer than its newest delete;
- a namespace's outputs are kept sorted by stamp; with ``max_outputs_per_namespace`` only the newest
  ones are kept (the output cache is a cache), which is again order-independent: an output older than
  everything kept is dropped on arrival.

Worked example: replica A writes ``add(c, d1)`` at stamp 5 while replica B, which has not seen it,
writes ``delete_collection(c)`` at stamp 7. A applies 5 then 7 (d1 removed); B applies 7 then 5
(the add is older than the delete: ignored). Both end without d1. Had A's add been at stamp 9, both
would keep d1 and the collection. Tombstones (delete stamps) are kept so a late, older add stays dead.

Idempotence: ``apply`` remembers the ids of the records the state still holds (live documents, the
newest delete of each document and collection, each collection's newest add, kept outputs); such a
record applied again has no effect. Every other record was superseded by one the state holds, so
applying it again is dropped by last-writer-wins: it still has no effect. The memory is so bounded by
the live state, not by the log's length, however often documents are replaced.

Compaction: ``live_records()`` lists exactly the records the state holds. Applying them alone, in any
order, to an empty state gives the same state (same ``digest()``), so a log may be replaced by them
plus the records appended after they were taken (``embedded.py``, ``redis_backend.py``).

Listener hooks fire after each visible change, in apply order, serialized (never concurrently):

- ``on_document_added(ns, collection, doc_id, tokens)``: the document is now live with these tokens.
  Replacing a document fires ``on_document_deleted`` for the old version first.
- ``on_document_deleted(ns, collection, doc_id)``
- ``on_collection_deleted(ns, collection)``: the collection and all its documents are gone (no
  per-document events). If a concurrent newer add keeps the collection alive, the documents the
  delete removed get ``on_document_deleted`` instead.
- ``on_output_appended(ns, tokens)``
- ``on_output_evicted(ns, tokens)``: the oldest output left the bounded output log.

So after any sequence of events the listener's content equals the state's. Readers never wait for
listeners: the data lock is released before hooks run.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .records import CLOCK, AddDocument, AppendOutput, DeleteCollection, DeleteDocument, HybridClock, Record

__all__ = ["CollectionInfo", "DocumentInfo", "StateListener", "StoreState"]

log = logging.getLogger(__name__)

Stamp = tuple[int, str]  # (stamp, record_id): a total order over records
_NEVER: Stamp = (-1, "")

_HOOKS = ("on_document_added", "on_document_deleted", "on_collection_deleted", "on_output_appended",
          "on_output_evicted")


class StateListener(Protocol):
    """What an index owner implements (any subset of the methods; missing ones are skipped)."""

    def on_document_added(self, namespace: str, collection: str, doc_id: str,
                          tokens: np.ndarray) -> None: ...  # tokens: [num_tokens] int32, read-only

    def on_document_deleted(self, namespace: str, collection: str, doc_id: str) -> None: ...

    def on_collection_deleted(self, namespace: str, collection: str) -> None: ...

    def on_output_appended(self, namespace: str, tokens: np.ndarray) -> None: ...  # [num_tokens] int32

    def on_output_evicted(self, namespace: str, tokens: np.ndarray) -> None: ...  # [num_tokens] int32


@dataclass(frozen=True)
class DocumentInfo:
    doc_id: str
    text: str
    metadata: Mapping[str, Any]
    token_count: int


@dataclass(frozen=True)
class CollectionInfo:
    name: str
    document_count: int
    token_count: int


def _stamp(record: Record) -> Stamp:
    return (record.stamp, record.record_id)


def _same(a: Record | None, b: Record | None) -> bool:
    """The same record (by id: a record delivered twice is two objects)."""
    return a is not None and b is not None and a.record_id == b.record_id


@dataclass
class _Collection:
    deleted: Stamp = _NEVER  # newest delete-collection
    deleted_record: DeleteCollection | None = None  # the record of ``deleted``
    last_add: Stamp = _NEVER  # newest add of any document, live or not
    last_add_record: AddDocument | None = None  # the record of ``last_add`` (keeps ``exists`` on replay)
    docs: dict[str, AddDocument] = field(default_factory=dict)  # live documents
    tombstones: dict[str, DeleteDocument] = field(default_factory=dict)  # newest delete per doc id
    token_count: int = 0

    def tombstone(self, doc_id: str) -> Stamp:
        t = self.tombstones.get(doc_id)
        return _NEVER if t is None else _stamp(t)

    @property
    def exists(self) -> bool:
        return self.last_add > self.deleted


@dataclass
class _Namespace:
    collections: dict[str, _Collection] = field(default_factory=dict)
    outputs: list[tuple[Stamp, np.ndarray]] = field(default_factory=list)  # sorted by stamp
    output_tokens: int = 0


_Event = tuple[str, tuple[Any, ...]]


class StoreState:
    """Thread-safe; ``apply`` is called by request threads (own appends) and the follower thread.

    max_outputs_per_namespace: keep only this many newest outputs per namespace (None: all). Every
    replica of a deployment must use the same value, or their output caches differ.
    """

    def __init__(self, clock: HybridClock = CLOCK, *, max_outputs_per_namespace: int | None = 10_000) -> None:
        if max_outputs_per_namespace is not None and max_outputs_per_namespace < 1:
            raise ValueError(f"max_outputs_per_namespace must be None or >= 1, "
                             f"got {max_outputs_per_namespace}")
        self._output_limit = max_outputs_per_namespace
        self._clock = clock
        self._lock = threading.Lock()  # guards the data below; held briefly
        self._apply_lock = threading.RLock()  # serializes apply + hooks so hooks see apply order
        self._namespaces: dict[str, _Namespace] = {}
        self._applied: set[str] = set()
        self._listeners: list[dict[str, Callable[..., object]]] = []
        self.applied = 0
        self.duplicates = 0
        self.outputs_evicted = 0
        self.listener_errors = 0

    # ---- listeners -------------------------------------------------------------------------

    def subscribe(self, listener: object, *, replay_existing: bool = True) -> Callable[[], None]:
        """Register ``listener`` (see ``StateListener``); with ``replay_existing`` it first gets
        ``on_document_added`` / ``on_output_appended`` for everything already applied, atomically
        with respect to later applies (nothing missed, nothing twice). Returns an unsubscribe."""
        hooks = {name: fn for name in _HOOKS if callable(fn := getattr(listener, name, None))}
        with self._apply_lock:
            if replay_existing:
                with self._lock:
                    events = self._snapshot_events()
                self._emit([hooks], events)
            self._listeners.append(hooks)

        def unsubscribe() -> None:
            with self._apply_lock:
                if hooks in self._listeners:
                    self._listeners.remove(hooks)

        return unsubscribe

    def _snapshot_events(self) -> list[_Event]:
        events: list[_Event] = []
        for ns_name, ns in self._namespaces.items():
            for coll_name, coll in ns.collections.items():
                for doc in coll.docs.values():
                    events.append(("on_document_added", (ns_name, coll_name, doc.doc_id, doc.tokens)))
            events += [("on_output_appended", (ns_name, tokens)) for _, tokens in ns.outputs]
        return events

    def _emit(self, listeners: list[dict[str, Callable[..., object]]], events: list[_Event]) -> None:
        for name, args in events:
            for hooks in listeners:
                fn = hooks.get(name)
                if fn is None:
                    continue
                try:
                    fn(*args)
                except Exception:
                    # One broken index must not stop the log (or the follower thread); it is
                    # counted and logged, and the state stays correct.
                    self.listener_errors += 1
                    log.exception("store listener %s failed", name)

    # ---- apply -----------------------------------------------------------------------------

    def apply(self, record: Record) -> bool:
        """Apply one record; return False (no effect) when its id was applied before."""
        with self._apply_lock:
            with self._lock:
                if record.record_id in self._applied:
                    self.duplicates += 1
                    return False
                self._applied.add(record.record_id)
                self.applied += 1
                self._clock.observe(record.stamp)
                ns = self._namespaces.setdefault(record.namespace, _Namespace())
                if isinstance(record, AddDocument):
                    events = self._add(ns, record)
                elif isinstance(record, DeleteDocument):
                    events = self._delete_doc(ns, record)
                elif isinstance(record, DeleteCollection):
                    events = self._delete_collection(ns, record)
                elif isinstance(record, AppendOutput):
                    events = self._append_output(ns, record)
                else:
                    raise TypeError(f"not a store record: {type(record).__name__}")
            if self._listeners and events:
                self._emit(self._listeners, events)
            return True

    def _forget(self, record: Record | None) -> None:
        """``record`` is no longer held by the state (superseded): forget its id. Applied again, it is
        dropped by last-writer-wins, so it still has no effect (module docstring)."""
        if record is not None:
            self._applied.discard(record.record_id)

    def _append_output(self, ns: _Namespace, r: AppendOutput) -> list[_Event]:
        s, limit = _stamp(r), self._output_limit
        if limit is not None and len(ns.outputs) >= limit and s < ns.outputs[0][0]:
            self._forget(r)
            return []  # older than every kept output: it would be evicted at once
        bisect.insort(ns.outputs, (s, r.tokens), key=lambda e: e[0])
        ns.output_tokens += len(r.tokens)
        events: list[_Event] = [("on_output_appended", (r.namespace, r.tokens))]
        if limit is not None and len(ns.outputs) > limit:
            (_, old_id), old_tokens = ns.outputs.pop(0)
            ns.output_tokens -= len(old_tokens)
            self.outputs_evicted += 1
            # Forgetting the id keeps memory bounded and stays idempotent: a replayed evicted output
            # is older than everything kept, so the check above drops it.
            self._applied.discard(old_id)
            events.append(("on_output_evicted", (r.namespace, old_tokens)))
        return events

    def _add(self, ns: _Namespace, r: AddDocument) -> list[_Event]:
        s = _stamp(r)
        coll = ns.collections.setdefault(r.collection, _Collection())
        if s > coll.last_add:
            previous = coll.last_add_record
            coll.last_add, coll.last_add_record = s, r
            if previous is not None and not _same(coll.docs.get(previous.doc_id), previous):
                self._forget(previous)  # held only as the collection's newest add
        old = coll.docs.get(r.doc_id)
        if s < coll.deleted or s < coll.tombstone(r.doc_id) or (old and s < _stamp(old)):
            if not _same(coll.last_add_record, r):
                self._forget(r)
            return []  # an older write than what this replica already has: last writer wins
        events: list[_Event] = []
        if old is not None:
            coll.token_count -= len(old.tokens)
            if not _same(coll.last_add_record, old):
                self._forget(old)
            events.append(("on_document_deleted", (r.namespace, r.collection, r.doc_id)))
        coll.docs[r.doc_id] = r
        coll.token_count += len(r.tokens)
        events.append(("on_document_added", (r.namespace, r.collection, r.doc_id, r.tokens)))
        return events

    def _delete_doc(self, ns: _Namespace, r: DeleteDocument) -> list[_Event]:
        s = _stamp(r)
        coll = ns.collections.setdefault(r.collection, _Collection())
        previous = coll.tombstones.get(r.doc_id)
        if previous is None or s > _stamp(previous):
            coll.tombstones[r.doc_id] = r
            self._forget(previous)
        else:
            self._forget(r)
        old = coll.docs.get(r.doc_id)
        if old is None or _stamp(old) > s:
            return []
        del coll.docs[r.doc_id]
        coll.token_count -= len(old.tokens)
        if not _same(coll.last_add_record, old):
            self._forget(old)
        return [("on_document_deleted", (r.namespace, r.collection, r.doc_id))]

    def _delete_collection(self, ns: _Namespace, r: DeleteCollection) -> list[_Event]:
        s = _stamp(r)
        coll = ns.collections.setdefault(r.collection, _Collection())
        if s < coll.deleted:
            self._forget(r)
            return []
        existed = coll.exists
        self._forget(coll.deleted_record)
        coll.deleted, coll.deleted_record = s, r
        removed = [doc_id for doc_id, doc in coll.docs.items() if _stamp(doc) < s]
        for doc_id in removed:
            doc = coll.docs.pop(doc_id)
            coll.token_count -= len(doc.tokens)
            if not _same(coll.last_add_record, doc):
                self._forget(doc)
        # Document tombstones older than the collection delete are subsumed by it.
        for tomb in [t for t in coll.tombstones.values() if _stamp(t) < s]:
            del coll.tombstones[tomb.doc_id]
            self._forget(tomb)
        if coll.last_add_record is not None and coll.last_add < s:
            # Older than the delete: the delete alone keeps the collection gone on replay.
            if not _same(coll.docs.get(coll.last_add_record.doc_id), coll.last_add_record):
                self._forget(coll.last_add_record)
            coll.last_add_record = None
        if existed and not coll.exists:
            return [("on_collection_deleted", (r.namespace, r.collection))]
        return [("on_document_deleted", (r.namespace, r.collection, d)) for d in removed]

    # ---- compaction --------------------------------------------------------------------------

    def live_count(self, *, outputs: bool = True) -> int:
        """How many records ``live_records(outputs=...)`` would list (cheap: no list is built)."""
        with self._lock:
            if outputs:
                return len(self._applied)
            return len(self._applied) - sum(len(ns.outputs) for ns in self._namespaces.values())

    def live_records(self, *, outputs: bool = True) -> list[Record]:
        """The records the state holds (see Compaction in the module docstring), documents' first;
        with ``outputs=False`` only the documents' (add/delete document, delete collection)."""
        with self._apply_lock, self._lock:
            records: list[Record] = []
            for ns in self._namespaces.values():
                for coll in ns.collections.values():
                    held: dict[str, Record] = {}
                    for rec in (coll.deleted_record, coll.last_add_record, *coll.docs.values(),
                                *coll.tombstones.values()):
                        if rec is not None:
                            held[rec.record_id] = rec
                    records += held.values()
            if outputs:
                for ns_name, ns in self._namespaces.items():
                    records += [AppendOutput(ns_name, tokens, record_id=rid, stamp=stamp)
                                for (stamp, rid), tokens in ns.outputs]
            return records

    # ---- queries (each namespace sees only its own data) -----------------------------------

    def namespaces(self) -> list[str]:
        with self._lock:
            return sorted(name for name, ns in self._namespaces.items()
                          if ns.outputs or any(c.exists for c in ns.collections.values()))

    def list_collections(self, namespace: str) -> list[CollectionInfo]:
        with self._lock:
            ns = self._namespaces.get(namespace)
            if ns is None:
                return []
            return [CollectionInfo(name, len(c.docs), c.token_count)
                    for name, c in sorted(ns.collections.items()) if c.exists]

    def get_collection(self, namespace: str, collection: str) -> CollectionInfo | None:
        with self._lock:
            coll = self._collection(namespace, collection)
            return None if coll is None else CollectionInfo(collection, len(coll.docs), coll.token_count)

    def list_documents(self, namespace: str, collection: str) -> list[DocumentInfo]:
        with self._lock:
            coll = self._collection(namespace, collection)
            docs = [] if coll is None else sorted(coll.docs.values(), key=lambda d: d.doc_id)
        return [DocumentInfo(d.doc_id, d.text, d.metadata, len(d.tokens)) for d in docs]

    def get_document(self, namespace: str, collection: str, doc_id: str) -> DocumentInfo | None:
        with self._lock:
            coll = self._collection(namespace, collection)
            d = None if coll is None else coll.docs.get(doc_id)
        return None if d is None else DocumentInfo(d.doc_id, d.text, d.metadata, len(d.tokens))

    def has_document(self, namespace: str, collection: str, doc_id: str) -> bool:
        with self._lock:
            coll = self._collection(namespace, collection)
            return coll is not None and doc_id in coll.docs

    def document_tokens(self, namespace: str, collection: str, doc_id: str) -> np.ndarray | None:
        """[num_tokens] int32, read-only; None when the document is not live."""
        with self._lock:
            coll = self._collection(namespace, collection)
            d = None if coll is None else coll.docs.get(doc_id)
        return None if d is None else d.tokens

    def outputs(self, namespace: str) -> list[np.ndarray]:
        """The namespace's output log, oldest first (by stamp); each [num_tokens] int32, read-only."""
        with self._lock:
            ns = self._namespaces.get(namespace)
            return [] if ns is None else [tokens for _, tokens in ns.outputs]

    def _collection(self, namespace: str, collection: str) -> _Collection | None:
        ns = self._namespaces.get(namespace)
        coll = None if ns is None else ns.collections.get(collection)
        return coll if coll is not None and coll.exists else None

    def stats(self) -> dict[str, int]:
        with self._lock:
            colls = [c for ns in self._namespaces.values() for c in ns.collections.values() if c.exists]
            return {
                "namespaces": sum(1 for ns in self._namespaces.values()
                                  if ns.outputs or any(c.exists for c in ns.collections.values())),
                "collections": len(colls),
                "documents": sum(len(c.docs) for c in colls),
                "document_tokens": sum(c.token_count for c in colls),
                "outputs": sum(len(ns.outputs) for ns in self._namespaces.values()),
                "output_tokens": sum(ns.output_tokens for ns in self._namespaces.values()),
                "records_applied": self.applied,
                "duplicates_skipped": self.duplicates,
                "outputs_evicted": self.outputs_evicted,
                "listener_errors": self.listener_errors,
            }

    def digest(self) -> str:
        """SHA-256 of the visible state (documents with text, metadata and tokens; outputs in stamp
        order). Two replicas that applied the same set of records have the same digest."""
        h = hashlib.sha256()
        with self._lock:
            for ns_name in sorted(self._namespaces):
                ns = self._namespaces[ns_name]
                h.update(b"N" + ns_name.encode() + b"\0")
                for coll_name in sorted(ns.collections):
                    coll = ns.collections[coll_name]
                    if not coll.exists:
                        continue
                    h.update(b"C" + coll_name.encode() + b"\0")
                    for doc_id in sorted(coll.docs):
                        d = coll.docs[doc_id]
                        meta = json.dumps(dict(d.metadata), sort_keys=True).encode()
                        for part in (doc_id.encode(), d.text.encode(), meta):
                            h.update(len(part).to_bytes(8, "little") + part)
                        h.update(d.tokens.tobytes())
                for (_, rid), tokens in ns.outputs:
                    h.update(b"O" + rid.encode() + len(tokens).to_bytes(8, "little") + tokens.tobytes())
        return h.hexdigest()
