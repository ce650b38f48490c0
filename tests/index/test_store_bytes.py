"""to_bytes / from_bytes: round trips, and a clear CorruptIndexError for every kind of bad input."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookupspec.index import ContextIndex, CorpusIndex, CorruptIndexError, LookupConfig, OutputIndex
from lookupspec.index.serialize import pack, unpack

CFG = LookupConfig(max_match=4, max_depth=4)
TAILS = [np.array(t, np.int32) for t in ([1, 2], [3], [2, 3, 1], [5, 5])]


def _stores() -> list:
    rng = np.random.default_rng(0)
    ctx = ContextIndex(rng.integers(0, 6, 300))
    corpus = CorpusIndex()
    for i in range(6):
        corpus.add_document(f"doc-{i}", rng.integers(0, 6, 40))
    corpus.delete_document("doc-2")
    out = OutputIndex(cap_tokens=100)
    for _ in range(10):
        out.append(rng.integers(0, 6, 25))
    return [ctx, corpus, out]


def _results(store) -> list:
    return [store.lookup(t, CFG).paths() for t in TAILS]


@pytest.mark.parametrize("idx", [0, 1, 2], ids=["context", "corpus", "output"])
def test_round_trip_preserves_lookups(idx: int) -> None:
    store = _stores()[idx]
    data = store.to_bytes()
    back = type(store).from_bytes(data)
    assert _results(back) == _results(store)
    assert len(back) == len(store)
    assert back.to_bytes() == data


def test_round_trip_keeps_documents_and_output_order() -> None:
    _, corpus, out = _stores()
    back = CorpusIndex.from_bytes(corpus.to_bytes())
    assert back.num_documents == corpus.num_documents == 5
    assert "doc-2" not in back and "doc-3" in back
    back.add_document("new", [1, 2, 3])
    assert back.num_documents == 6
    o2 = OutputIndex.from_bytes(out.to_bytes())
    for _ in range(20):
        o2.append([1, 2, 3, 4, 5])
    assert len(o2) <= 100


def test_empty_stores_round_trip() -> None:
    for store in (ContextIndex(), CorpusIndex(), OutputIndex(10)):
        back = type(store).from_bytes(store.to_bytes())
        assert len(back) == 0
        assert back.lookup(np.array([1], np.int32), CFG).match_len == 0


@pytest.mark.parametrize("idx", [0, 1, 2], ids=["context", "corpus", "output"])
def test_truncated_bytes_raise_corrupt_store_error(idx: int) -> None:
    store = _stores()[idx]
    data = store.to_bytes()
    for cut in (0, 5, 20, len(data) // 2, len(data) - 1):
        with pytest.raises(CorruptIndexError):
            type(store).from_bytes(data[:cut])
    with pytest.raises(CorruptIndexError):
        type(store).from_bytes(data + b"\0")


@pytest.mark.parametrize("idx", [0, 1, 2], ids=["context", "corpus", "output"])
def test_flipped_bytes_raise_corrupt_store_error(idx: int) -> None:
    store = _stores()[idx]
    data = bytearray(store.to_bytes())
    rng = np.random.default_rng(idx)
    for pos in rng.integers(0, len(data), 40):
        bad = bytearray(data)
        bad[pos] ^= 0x5A
        with pytest.raises(CorruptIndexError):
            type(store).from_bytes(bytes(bad))


def test_wrong_kind_and_version_are_reported() -> None:
    data = ContextIndex([1, 2]).to_bytes()
    with pytest.raises(CorruptIndexError, match="expected a 'corpus' store"):
        CorpusIndex.from_bytes(data)
    bumped = data[:8] + struct.pack("<H", 99) + data[10:]
    with pytest.raises(CorruptIndexError, match="version 99"):
        ContextIndex.from_bytes(bumped)
    with pytest.raises(CorruptIndexError, match="magic"):
        ContextIndex.from_bytes(b"x" * 64)


def _forge(kind: str, meta: dict, arrays: list[np.ndarray]) -> bytes:
    """Well-formed container (valid checksum) around inconsistent content."""
    return pack(kind, meta, arrays)


def test_valid_checksum_but_inconsistent_content_is_rejected_before_numba_sees_it() -> None:
    corpus = CorpusIndex()
    corpus.add_documents([("a", [1, 2, 3]), ("b", [2, 3, 4])])
    meta, arrays = unpack(corpus.to_bytes(), "corpus")
    text, sa, starts, lens, bases, alive = arrays
    cases = {
        "sa out of range": [text, sa + 1000, starts, lens, bases, alive],
        "sa unsorted": [text, sa[::-1].copy(), starts, lens, bases, alive],
        "sa too short": [text, sa[:-1], starts, lens, bases, alive],
        "doc past text": [text, sa, starts, lens + 5, bases, alive],
        "no separator": [text[:-1], sa, starts, lens, bases, alive],
        "negative token": [np.where(text == 3, -7, text).astype(np.int32), sa, starts, lens, bases, alive],
    }
    for name, arrs in cases.items():
        with pytest.raises(CorruptIndexError):
            CorpusIndex.from_bytes(_forge("corpus", meta, arrs))
        assert name
    with pytest.raises(CorruptIndexError):
        CorpusIndex.from_bytes(_forge("corpus", {**meta, "segments": [{"doc_ids": ["a"]}]}, arrays))
    with pytest.raises(CorruptIndexError):
        CorpusIndex.from_bytes(_forge("corpus", {**meta, "segments": [{"doc_ids": ["a", "a"]}]}, arrays))
    with pytest.raises(CorruptIndexError):
        ContextIndex.from_bytes(_forge("context", {"max_ngram": 99, "n": 2}, [np.array([1, 2], np.int32)]))
    with pytest.raises(CorruptIndexError):
        ContextIndex.from_bytes(_forge("context", {"max_ngram": 4, "n": 2}, [np.array([1, -2], np.int32)]))
    with pytest.raises(CorruptIndexError):
        OutputIndex.from_bytes(_forge("output", {"next_base": 0, "segments": []}, []))


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash(blob: bytes) -> None:
    for cls in (ContextIndex, CorpusIndex, OutputIndex):
        with pytest.raises(CorruptIndexError):
            cls.from_bytes(blob)
