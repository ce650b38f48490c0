"""The output index: one per namespace, earlier outputs (and optionally prompts), oldest evicted first.

Each appended output is a document of a segment set (``segments.py``), so outputs never match across
each other's boundaries and lookups count exactly. When the live tokens exceed ``cap_tokens`` the
oldest outputs are deleted until at most ``evict_to * cap_tokens`` remain: the slack makes eviction
(a linear filter of the affected segment) happen once per ``(1 - evict_to) * cap_tokens`` appended
tokens instead of on every append. A single output longer than the cap keeps only its last
``cap_tokens`` tokens.

Worked example: ``OutputIndex(cap_tokens=10, evict_to=0.5)``; append 4, 4, then 4 tokens: 12 > 10, so
the oldest outputs go until <= 5 remain: only the newest output (4 tokens) is left.
"""

from __future__ import annotations

import threading

import numpy as np

from .lookup import Continuations, LookupConfig, as_tokens
from .segments import Segment, SegmentSet
from .serialize import CorruptIndexError, pack, unpack

__all__ = ["OutputIndex"]


class OutputIndex:
    """Append-only, size-capped. Thread-safe: appends serialize, lookups never block."""

    _FORMAT_KIND = "output"

    def __init__(self, cap_tokens: int, *, evict_to: float = 0.9, auto_merge: bool = True) -> None:
        if cap_tokens < 1:
            raise ValueError(f"cap_tokens must be >= 1, got {cap_tokens}")
        if not 0.0 < evict_to <= 1.0:
            raise ValueError(f"evict_to must be in (0, 1], got {evict_to}")
        self.cap_tokens = int(cap_tokens)
        self.evict_to = float(evict_to)
        self._set = SegmentSet(auto_merge=auto_merge)
        self._lock = threading.Lock()
        self._seq = 0
        self._fifo: list[tuple[str, int]] = []  # (doc id, length) of live outputs, oldest first
        self._head = 0  # index of the oldest live entry in _fifo

    def append(self, tokens: object) -> None:
        """Add one finished output [len] int; evicts the oldest outputs when over the cap."""
        arr = as_tokens(tokens)
        if arr.shape[0] > self.cap_tokens:
            arr = arr[-self.cap_tokens:]
        with self._lock:
            doc_id = str(self._seq)
            self._seq += 1
            self._set.add([(doc_id, arr)])
            self._fifo.append((doc_id, int(arr.shape[0])))
            if len(self._set) > self.cap_tokens:
                target = int(self.evict_to * self.cap_tokens)
                live = len(self._set)
                victims = []
                while live > target and self._head < len(self._fifo) - 1:
                    vid, n = self._fifo[self._head]
                    self._head += 1
                    victims.append(vid)
                    live -= n
                self._set.delete(victims)
                if self._head > 1024 and self._head * 2 > len(self._fifo):
                    del self._fifo[: self._head]
                    self._head = 0

    def __len__(self) -> int:
        """Live tokens."""
        return len(self._set)

    @property
    def num_outputs(self) -> int:
        return self._set.num_documents

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self._set.segments

    def memory_bytes(self) -> int:
        return self._set.memory_bytes()

    def lookup(self, tail: np.ndarray, cfg: LookupConfig) -> Continuations:
        return self._set.lookup(tail, cfg)

    def lookup_into(self, tail: np.ndarray, cfg: LookupConfig, out: np.ndarray,
                    at: int) -> tuple[int, int, int]:
        """``lookup`` writing the tree to ``out`` [5, >= at + max_nodes] int64 (see ``TokenIndex``)."""
        return self._set.lookup_into(tail, cfg, out, at)

    def to_bytes(self) -> bytes:
        with self._lock:
            meta, arrays = self._set.to_payload()
            meta.update(cap_tokens=self.cap_tokens, evict_to=self.evict_to, seq=self._seq)
            return pack(self._FORMAT_KIND, meta, arrays)

    @classmethod
    def from_bytes(cls, data: bytes) -> OutputIndex:
        meta, arrays = unpack(data, cls._FORMAT_KIND)
        cap, evict_to, seq = meta.get("cap_tokens"), meta.get("evict_to"), meta.get("seq")
        if (not isinstance(cap, int) or cap < 1 or not isinstance(evict_to, int | float)
                or not 0.0 < evict_to <= 1.0 or not isinstance(seq, int) or seq < 0):
            raise CorruptIndexError("output index: bad metadata")
        out = cls(cap, evict_to=float(evict_to))
        out._set = SegmentSet.from_payload(meta, arrays)
        out._seq = seq
        docs = out._set.oldest_documents()
        if any(not d.isdigit() or int(d) >= seq for d, _ in docs):
            raise CorruptIndexError("output index: bad output ids")
        out._fifo = docs
        return out
