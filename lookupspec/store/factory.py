"""``Store`` (a log plus the state it builds) and ``open_store``, the one way the gateway opens it."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .base import AppendAck, RecordLog, StoreClosedError, StoreError
from .embedded import EmbeddedConfig, EmbeddedLog
from .memory import MemoryLog
from .records import AddDocument, AppendOutput, DeleteCollection, DeleteDocument, Record
from .redis_backend import RedisConfig, RedisLog
from .state import StoreState

__all__ = ["Store", "memory_store", "open_store"]

log = logging.getLogger(__name__)


class Store:
    """Holds a ``RecordLog`` and the ``StoreState`` built from it.

    Every write goes log first, state second: ``append`` applies a record locally only after the log
    acknowledged it, so local state never shows what a restart would lose (embedded), or what other
    replicas will never receive unless this process dies while it is buffered (Redis, degraded).

    Compaction: the embedded log is compacted here, after an append that leaves it due
    (``EmbeddedLog.compaction_due``) and once after the start-up replay; appends and the compaction
    take ``_write_lock``, so the snapshot (``StoreState.live_records``) holds every record in the log.
    The Redis log compacts its documents stream itself, from its follower thread (``RedisLog``).
    """

    def __init__(self, log: RecordLog, state: StoreState | None = None) -> None:
        self.log = log
        self.state = state if state is not None else StoreState()
        self._started = False
        self._closed = False
        self._lock = threading.Lock()
        self._embedded = log if isinstance(log, EmbeddedLog) else None
        # Only the embedded log needs appends and state in step (its appends are serialized anyway).
        self._write_lock: contextlib.AbstractContextManager[Any] = (
            threading.Lock() if self._embedded is not None else contextlib.nullcontext())

    def start(self) -> int:
        """Replay the log into the state, then follow it. Returns the number of records replayed.
        Subscribe index listeners before ``start`` to get every record as an event (or after, with
        ``replay_existing=True``)."""
        with self._lock:
            if self._closed:
                raise StoreClosedError("the store is closed")
            if self._started:
                raise RuntimeError("store already started")
            count = self.log.replay(self.state.apply)
            if isinstance(self.log, RedisLog):
                self.log.set_snapshot_source(self.state.live_records, self.state.live_count)
            self.log.start_following(self.state.apply)
            self._started = True
        self._maybe_compact()
        return count

    def subscribe(self, listener: object, *, replay_existing: bool = True) -> Callable[[], None]:
        return self.state.subscribe(listener, replay_existing=replay_existing)

    def append(self, record: Record) -> AppendAck:
        if not self._started or self._closed:
            raise StoreClosedError("the store is not started or already closed")
        with self._write_lock:
            ack = self.log.append(record)
            self.state.apply(record)
        self._maybe_compact()
        return ack

    def append_many(self, records: Sequence[Record]) -> list[AppendAck]:
        """Append a batch (e.g. one documents upload) in one fsync / one round trip, then apply it.
        All acknowledged, or none applied and it raises."""
        if not self._started or self._closed:
            raise StoreClosedError("the store is not started or already closed")
        with self._write_lock:
            acks = self.log.append_many(records)
            for record in records:
                self.state.apply(record)
        self._maybe_compact()
        return acks

    def _maybe_compact(self) -> None:
        """Compact the embedded log when it is due. A failure is logged (and shown in ``health()``'s
        ``last_error``), never raised: the write that triggered it was acknowledged already, and the
        old log stays in use."""
        if self._embedded is None or not self._embedded.compaction_due(self.state.live_count()):
            return
        with self._write_lock:
            if self._closed or not self._embedded.compaction_due(self.state.live_count()):
                return
            try:
                self._embedded.compact(self.state.live_records())
            except StoreError:
                log.exception("store compaction failed")

    def add_document(self, namespace: str, collection: str, doc_id: str, text: str,
                     tokens: np.ndarray, metadata: Mapping[str, Any] | None = None) -> AppendAck:
        """tokens: [num_tokens] int32 token ids of ``text``."""
        return self.append(AddDocument(namespace, collection, doc_id, text, tokens, dict(metadata or {})))

    def delete_document(self, namespace: str, collection: str, doc_id: str) -> AppendAck:
        return self.append(DeleteDocument(namespace, collection, doc_id))

    def delete_collection(self, namespace: str, collection: str) -> AppendAck:
        return self.append(DeleteCollection(namespace, collection))

    def append_output(self, namespace: str, tokens: np.ndarray) -> AppendAck:
        """tokens: [num_tokens] int32, one finished request's output."""
        return self.append(AppendOutput(namespace, tokens))

    def health(self) -> dict[str, Any]:
        """The log's health (``state`` ok/degraded, ``buffered``, ``overflow``, ``last_error``,
        ``lag_s``, ...) plus the state's sizes (``documents``, ``outputs``, ...)."""
        return {**self.log.health(), **self.state.stats()}

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with self._write_lock:
            self.log.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def memory_store(*, max_outputs_per_namespace: int | None = 10_000) -> Store:
    """A started store that persists nothing (``MemoryLog``): the in-process client's."""
    store = Store(MemoryLog(), StoreState(max_outputs_per_namespace=max_outputs_per_namespace))
    store.start()
    return store


def open_store(data_dir: Path, redis_url: str | None, *, key_prefix: str = "lookupspec:",
               stream_maxlen: int | None = 100_000, buffer_limit: int = 10_000,
               output_buffer_limit: int = 1_000,
               max_outputs_per_namespace: int | None = 10_000, compact_min_records: int = 10_000,
               compact_ratio: float = 2.0, start: bool = True) -> Store:
    """Open the embedded log under ``data_dir``, or the Redis log at ``redis_url`` (the Redis streams
    are then the log, and ``data_dir`` only holds spill files: appends still buffered when the store
    is closed during a Redis outage, see ``spill.py``). ``key_prefix``, ``stream_maxlen`` (cap of the
    outputs stream), ``buffer_limit`` and ``output_buffer_limit`` configure Redis (see ``RedisConfig``);
    ``max_outputs_per_namespace`` bounds each namespace's in-memory output cache (``StoreState``);
    ``compact_min_records`` and ``compact_ratio`` say when the log (the Redis documents stream) is
    compacted: it holds at least that many records and more than ratio x the live ones (0: never).
    With ``start`` (default) the store has replayed the log and follows it when this returns. For
    finer Redis settings build ``Store(RedisLog(RedisConfig(...)), StoreState(...))`` directly."""
    log: RecordLog
    if redis_url:
        log = RedisLog(RedisConfig(redis_url, key_prefix=key_prefix, stream_maxlen=stream_maxlen,
                                   buffer_limit=buffer_limit, output_buffer_limit=output_buffer_limit,
                                   spill_dir=Path(data_dir), compact_min_records=compact_min_records,
                                   compact_ratio=compact_ratio))
    else:
        log = EmbeddedLog(EmbeddedConfig(Path(data_dir), compact_min_records=compact_min_records,
                                         compact_ratio=compact_ratio))
    store = Store(log, StoreState(max_outputs_per_namespace=max_outputs_per_namespace))
    if start:
        try:
            store.start()
        except BaseException:
            store.close()
            raise
    return store
