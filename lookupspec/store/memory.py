"""``MemoryLog``: a log that keeps nothing, for a process that needs no persistence (the in-process
client). Appends are acknowledged at once and applied to the state by the ``Store``; a restart starts
empty."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from .base import AppendAck, ApplyFn
from .records import Record

__all__ = ["MemoryLog"]


class MemoryLog:
    def __init__(self) -> None:
        self._offsets = itertools.count()

    def append(self, record: Record) -> AppendAck:
        return AppendAck(record.record_id, str(next(self._offsets)))

    def append_many(self, records: Sequence[Record]) -> list[AppendAck]:
        return [self.append(r) for r in records]

    def replay(self, apply: ApplyFn) -> int:
        return 0

    def start_following(self, apply: ApplyFn) -> None:
        pass

    def stop(self) -> None:
        pass

    def health(self) -> dict[str, Any]:
        return {"state": "ok", "backend": "memory", "buffered": 0, "overflow": 0, "last_error": None,
                "lag_s": 0.0}

    def close(self) -> None:
        pass
