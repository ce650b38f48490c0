"""Record types and their binary encoding."""

from __future__ import annotations

import dataclasses
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookupspec.store import (
    AddDocument,
    AppendOutput,
    DeleteCollection,
    DeleteDocument,
    RecordError,
    decode_record,
    encode_record,
)
from lookupspec.store.records import RECORD_VERSION

names = st.text(min_size=1, max_size=20)
token_arrays = st.lists(st.integers(-(2**31), 2**31 - 1), max_size=50).map(
    lambda xs: np.array(xs, dtype=np.int32))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)
records = st.one_of(
    st.builds(AddDocument, names, names, names, st.text(max_size=200), token_arrays,
              st.dictionaries(st.text(max_size=8), json_values, max_size=4)),
    st.builds(DeleteDocument, names, names, names),
    st.builds(DeleteCollection, names, names),
    st.builds(AppendOutput, names, token_arrays),
)


@settings(max_examples=150, deadline=None)
@given(records)
def test_every_record_survives_encode_decode(record):
    decoded = decode_record(encode_record(record))
    assert decoded == record
    assert type(decoded) is type(record)
    assert (decoded.record_id, decoded.stamp, decoded.namespace) == (record.record_id, record.stamp,
                                                                     record.namespace)
    if hasattr(record, "tokens"):
        assert decoded.tokens.dtype == np.int32
        assert np.array_equal(decoded.tokens, record.tokens)
    if isinstance(record, AddDocument):
        assert dict(decoded.metadata) == dict(record.metadata)


def test_token_ids_are_raw_int32_bytes_not_json():
    tokens = np.arange(1000, dtype=np.int32) * 7919
    empty = encode_record(AppendOutput("n", np.zeros(0, dtype=np.int32)))
    full = encode_record(AppendOutput("n", tokens))
    assert len(full) - len(empty) == 4 * len(tokens)
    assert tokens.astype("<i4").tobytes() in full
    assert len(empty) == 1 + 1 + 16 + 8 + (4 + 1) + 4 + 4  # header, namespace, token count, CRC
    assert full[0] == RECORD_VERSION


def test_every_single_bit_flip_is_detected():
    data = encode_record(AddDocument("ns", "c", "d", "some text", np.array([1, 2, 3], np.int32), {"k": 1}))
    for i in range(len(data)):
        for bit in range(8):
            broken = bytearray(data)
            broken[i] ^= 1 << bit
            with pytest.raises(RecordError):
                decode_record(bytes(broken))


def _with_crc(body: bytes) -> bytes:
    return body + struct.pack("<I", zlib.crc32(body))


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda body: body[:5], "truncated"),
    (lambda body: bytes([99]) + body[1:], "version 99"),
    (lambda body: body[:1] + bytes([42]) + body[2:], "kind 42"),
    (lambda body: body + b"extra", "trailing"),
    (lambda body: body[:-3], "truncated"),
])
def test_malformed_records_raise_a_clear_error(mutate, message):
    body = encode_record(AppendOutput("ns", np.array([5, 6], np.int32)))[:-4]
    with pytest.raises(RecordError, match=message):
        decode_record(_with_crc(mutate(body)))
    with pytest.raises(RecordError, match="CRC mismatch"):
        decode_record(body + b"\0\0\0\0")


def test_records_validate_and_are_immutable():
    with pytest.raises(RecordError, match="namespace"):
        AppendOutput("", np.array([1], np.int32))
    with pytest.raises(RecordError, match="1-D"):
        AppendOutput("ns", np.zeros((2, 2), np.int32))
    with pytest.raises(RecordError, match="int32"):
        AppendOutput("ns", np.array([2**40]))
    with pytest.raises(RecordError, match="JSON"):
        AddDocument("ns", "c", "d", "t", np.array([1], np.int32), {"bad": object()})
    with pytest.raises(RecordError, match="record_id"):
        DeleteCollection("ns", "c", record_id="not-hex")

    source = np.array([1, 2, 3], dtype=np.int64)
    record = AddDocument("ns", "c", "d", "t", source, {"k": [1]})
    source[0] = 99  # the record owns a private copy
    assert record.tokens.tolist() == [1, 2, 3] and record.tokens.dtype == np.int32
    with pytest.raises(ValueError):
        record.tokens[0] = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.text = "other"
    with pytest.raises(TypeError):
        record.metadata["k"] = 2


def test_stamps_increase_and_ids_are_unique():
    records = [AppendOutput("ns", np.array([i], np.int32)) for i in range(1000)]
    stamps = [r.stamp for r in records]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert len({r.record_id for r in records}) == len(records)
