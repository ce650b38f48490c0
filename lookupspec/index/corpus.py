"""The corpus index: one per document collection (RAG documents), millions of tokens.

Documents live in immutable suffix-array segments (``segments.py``): lookups in O(log n) whatever
the pattern's frequency, about 8 bytes per indexed token, a radix-sort build, and add/delete while
lookups run on other threads. A match never crosses a document boundary (documents are separated by
SEP, which no pattern contains).

Worked example::

    store = CorpusIndex()
    store.add_document("d1", [5, 6, 7, 8])
    store.add_document("d2", [5, 6, 9])
    c = store.lookup(np.array([1, 5, 6], np.int32), LookupConfig())
    # c.match_len == 2; children 9 (d2, more recent) and 7, count 1 each
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .lookup import Continuations, LookupConfig
from .segments import Segment, SegmentSet
from .serialize import pack, unpack

__all__ = ["CorpusIndex"]


class CorpusIndex:
    """A document collection. Thread-safe: one writer at a time, lookups never block."""

    _FORMAT_KIND = "corpus"

    def __init__(self, *, auto_merge: bool = True) -> None:
        self._set = SegmentSet(auto_merge=auto_merge)

    def add_document(self, doc_id: str, tokens: object) -> None:
        """Index ``tokens`` [len] int as ``doc_id`` (replacing a document with the same id)."""
        self._set.add([(doc_id, tokens)])

    def add_documents(self, docs: Iterable[tuple[str, object]]) -> None:
        """Bulk add: one segment for the whole batch (the fast path for building a collection)."""
        self._set.add(docs)

    def delete_document(self, doc_id: str) -> bool:
        """Remove a document; False if it was not there."""
        return self._set.delete([doc_id]) == 1

    def delete_documents(self, doc_ids: Iterable[str]) -> int:
        return self._set.delete(doc_ids)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._set

    def __len__(self) -> int:
        """Indexed (live) tokens."""
        return len(self._set)

    @property
    def num_documents(self) -> int:
        return self._set.num_documents

    @property
    def segments(self) -> tuple[Segment, ...]:
        return self._set.segments

    def memory_bytes(self) -> int:
        """Bytes held by the index arrays (text, suffix arrays, recency tables, document tables)."""
        return self._set.memory_bytes()

    def compact(self) -> None:
        """Merge all segments into one and drop deleted documents' text."""
        self._set.compact()

    def lookup(self, tail: np.ndarray, cfg: LookupConfig) -> Continuations:
        """Longest suffix match of ``tail`` [t] int32 in any document, continuations from all of them."""
        return self._set.lookup(tail, cfg)

    def lookup_into(self, tail: np.ndarray, cfg: LookupConfig, out: np.ndarray,
                    at: int) -> tuple[int, int, int]:
        """``lookup`` writing the tree to ``out`` [5, >= at + max_nodes] int64 (see ``TokenIndex``)."""
        return self._set.lookup_into(tail, cfg, out, at)

    def to_bytes(self) -> bytes:
        meta, arrays = self._set.to_payload()
        return pack(self._FORMAT_KIND, meta, arrays)

    @classmethod
    def from_bytes(cls, data: bytes) -> CorpusIndex:
        meta, arrays = unpack(data, cls._FORMAT_KIND)
        out = cls.__new__(cls)
        out._set = SegmentSet.from_payload(meta, arrays)
        return out
