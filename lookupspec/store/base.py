"""The interface both log backends implement, and the errors they raise.

A backend is only the log: it stores encoded records and hands decoded ones to an ``apply``
callback (in practice ``StoreState.apply``). It never interprets records; deduplication and
conflict resolution live in the state, so a backend may deliver a record more than once
(at-least-once delivery, exactly-once effect).

Lifecycle::

    log = EmbeddedLog(config)        # or RedisLog(config)
    log.replay(state.apply)          # start-up: every record already in the log, in log order
    log.start_following(state.apply) # records other replicas append from now on (Redis only)
    log.append(record)               # acknowledged append, see AppendAck
    log.append_many(records)         # a batch: one fsync / one pipelined round trip
    log.health()                     # {"state": "ok" | "degraded", "buffered": ..., ...}
    log.close()                      # stop() + release files / sockets / locks
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .records import Record

__all__ = [
    "AppendAck",
    "ApplyFn",
    "BufferFullError",
    "RecordLog",
    "StoreClosedError",
    "StoreError",
    "StoreLockedError",
]

ApplyFn = Callable[[Record], object]


class StoreError(RuntimeError):
    """Base class of the store's errors."""


class StoreLockedError(StoreError):
    """Another process holds the data directory's log lock."""


class StoreClosedError(StoreError):
    """The store was closed (or not started) and cannot take appends."""


class BufferFullError(StoreError):
    """Redis is unreachable and the bounded append buffer is full: the record was rejected (not
    applied, not acknowledged). Callers may retry later; the output cache may simply drop it."""


@dataclass(frozen=True)
class AppendAck:
    """What ``append`` acknowledged.

    offset: the record's position in the log: the byte offset of its frame for the embedded log,
        the stream entry id for Redis; ``None`` when the record was buffered.
    buffered: True when Redis was unreachable and the record is held in this replica's memory
        buffer until Redis returns (applied locally already; lost only if this process dies first).
    """

    record_id: str
    offset: str | None
    buffered: bool = False


class RecordLog(Protocol):
    """The replicated (Redis) or local (embedded) append-only record log."""

    def append(self, record: Record) -> AppendAck:
        """Append one record; return only once it is acknowledged (each backend's docstring
        states what acknowledged means). Raises ``BufferFullError`` / ``StoreError`` when the
        record was not accepted; a record that raised is not in the log."""
        ...

    def append_many(self, records: Sequence[Record]) -> list[AppendAck]:
        """Append a batch in one round trip (one fsync / one pipeline); all acknowledged, or none
        accepted and it raises."""
        ...

    def replay(self, apply: ApplyFn) -> int:
        """Feed every record already in the log to ``apply`` in log order; return how many."""
        ...

    def start_following(self, apply: ApplyFn) -> None:
        """Feed records appended by other replicas to ``apply`` from a background thread."""
        ...

    def stop(self) -> None:
        """Stop the background threads (joins them). Appends still work; see each backend for
        what happens to records still buffered."""
        ...

    def health(self) -> dict[str, Any]:
        """``state`` ("ok" | "degraded"), ``buffered``, ``overflow``, ``last_error``, ``lag_s`` and
        backend-specific counters. Never touches the network or disk."""
        ...

    def close(self) -> None:
        """``stop()``, then release files, locks and connections. Idempotent."""
        ...
