"""Log records of the shared store and their binary encoding.

The store is an append-only log of four record types. Every record carries

- a ``record_id`` (32 lowercase hex chars, a random UUID): the identity used for idempotence. A
  record applied twice (a replay, a retried write, a replica reading its own write back from Redis)
  has no second effect.
- a ``stamp`` (int64 nanoseconds from a hybrid logical clock): the order used to resolve concurrent
  writes (last writer wins, ties broken by ``record_id``), so every replica converges to the same
  state whatever order it applied the records in. See ``state.py``.

Encoding of one record (all integers little-endian)::

    u8  version (RECORD_VERSION)
    u8  kind (RecordKind)
    16B record id
    i64 stamp
    ... fields of the kind: str = u32 byte length + UTF-8; tokens = u32 count + count * int32 LE
    u32 CRC32 of every preceding byte

Example: ``AppendOutput(namespace="a", tokens=[7])`` encodes to 1+1+16+8 + (4+1) + (4+4) + 4 = 43 bytes.
Token ids are raw int32 bytes (4 bytes per token), never a JSON list. ``decode_record`` validates
version, kind, lengths, UTF-8 and the CRC and raises ``RecordError`` naming what is wrong.
"""

from __future__ import annotations

import enum
import json
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

__all__ = [
    "RECORD_VERSION",
    "AddDocument",
    "AppendOutput",
    "DeleteCollection",
    "DeleteDocument",
    "HybridClock",
    "Record",
    "RecordError",
    "RecordKind",
    "decode_record",
    "encode_record",
    "new_record_id",
]

RECORD_VERSION = 1

_HEADER = struct.Struct("<BB16sq")  # version, kind, record id, stamp
_U32 = struct.Struct("<I")
_TOKEN_DTYPE = np.dtype("<i4")


class RecordKind(enum.IntEnum):
    ADD_DOCUMENT = 1
    DELETE_DOCUMENT = 2
    DELETE_COLLECTION = 3
    APPEND_OUTPUT = 4


class RecordError(ValueError):
    """A record that cannot be built or decoded (bad field, truncated, CRC mismatch, ...)."""


class HybridClock:
    """Hybrid logical clock: wall-clock nanoseconds, strictly increasing within the process, and
    never behind any stamp this process has applied (``observe``). So a record written after this
    replica saw another record always gets a larger stamp than it, even with clock skew between
    replicas: causally later writes win."""

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def now(self) -> int:
        with self._lock:
            self._last = max(time.time_ns(), self._last + 1)
            return self._last

    def observe(self, stamp: int) -> None:
        with self._lock:
            self._last = max(self._last, stamp)


# One clock per process: a process is one replica, and every store it opens shares its causality.
CLOCK = HybridClock()


def new_record_id() -> str:
    return uuid.uuid4().hex


def _check_name(value: object, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise RecordError(f"{what} must be a non-empty string, got {value!r}")


def _check_common(record: Any) -> None:
    rid = record.record_id
    if not isinstance(rid, str) or len(rid) != 32 or rid.strip("0123456789abcdef"):
        raise RecordError(f"record_id must be 32 lowercase hex chars, got {rid!r}")
    if not isinstance(record.stamp, int) or not 0 <= record.stamp < 2**63:
        raise RecordError(f"stamp must be a non-negative int64, got {record.stamp!r}")
    _check_name(record.namespace, "namespace")


def _freeze_tokens(record: Any) -> None:
    """Validate the token ids and store them as a read-only 1-D int32 array owned by the record."""
    arr = record.tokens
    if not isinstance(arr, np.ndarray):
        arr = np.asarray(arr)
        if arr.size == 0:
            arr = arr.astype(np.int32)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise RecordError(f"tokens must be a 1-D integer array, got shape {arr.shape} dtype {arr.dtype}")
    if arr.dtype != np.int32 or arr.flags.writeable or not arr.flags.c_contiguous:
        if arr.dtype != np.int32 and arr.size and (arr.min() < -(2**31) or arr.max() >= 2**31):
            raise RecordError("token ids do not fit in int32")
        arr = np.array(arr, dtype=np.int32)  # a private copy: the caller may reuse its buffer
        arr.flags.writeable = False
    object.__setattr__(record, "tokens", arr)


def _freeze_metadata(record: Any) -> None:
    meta = record.metadata
    if not isinstance(meta, Mapping):
        raise RecordError(f"metadata must be a mapping, got {type(meta).__name__}")
    try:
        # The JSON round trip validates, deep-copies and canonicalizes (tuples become lists), so a
        # decoded record equals the one that was encoded.
        plain = json.loads(json.dumps(dict(meta), ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise RecordError(f"metadata must be JSON-serializable: {exc}") from None
    object.__setattr__(record, "metadata", MappingProxyType(plain))


def _record_eq(self: Any, other: object) -> bool:
    if type(self) is not type(other):
        return NotImplemented
    return encode_record(self) == encode_record(other)  # type: ignore[arg-type]


def _record_hash(self: Any) -> int:
    return hash(self.record_id)


# eq=False on the record classes: the generated __eq__ would compare numpy arrays with ==, which is
# ambiguous. Records compare by their encoding instead.


@dataclass(frozen=True, eq=False)
class AddDocument:
    """Add a document to a collection, or replace the document with the same id."""

    namespace: str
    collection: str
    doc_id: str
    text: str
    tokens: np.ndarray  # [num_tokens] int32
    metadata: Mapping[str, Any] = field(default_factory=dict)
    record_id: str = field(default_factory=new_record_id)
    stamp: int = field(default_factory=CLOCK.now)

    kind = RecordKind.ADD_DOCUMENT
    __eq__ = _record_eq
    __hash__ = _record_hash

    def __post_init__(self) -> None:
        _check_common(self)
        _check_name(self.collection, "collection")
        _check_name(self.doc_id, "doc_id")
        if not isinstance(self.text, str):
            raise RecordError(f"text must be a string, got {type(self.text).__name__}")
        _freeze_tokens(self)
        _freeze_metadata(self)


@dataclass(frozen=True, eq=False)
class DeleteDocument:
    namespace: str
    collection: str
    doc_id: str
    record_id: str = field(default_factory=new_record_id)
    stamp: int = field(default_factory=CLOCK.now)

    kind = RecordKind.DELETE_DOCUMENT
    __eq__ = _record_eq
    __hash__ = _record_hash

    def __post_init__(self) -> None:
        _check_common(self)
        _check_name(self.collection, "collection")
        _check_name(self.doc_id, "doc_id")


@dataclass(frozen=True, eq=False)
class DeleteCollection:
    namespace: str
    collection: str
    record_id: str = field(default_factory=new_record_id)
    stamp: int = field(default_factory=CLOCK.now)

    kind = RecordKind.DELETE_COLLECTION
    __eq__ = _record_eq
    __hash__ = _record_hash

    def __post_init__(self) -> None:
        _check_common(self)
        _check_name(self.collection, "collection")


@dataclass(frozen=True, eq=False)
class AppendOutput:
    """Append one finished request's output tokens to the namespace's shared output cache."""

    namespace: str
    tokens: np.ndarray  # [num_tokens] int32
    record_id: str = field(default_factory=new_record_id)
    stamp: int = field(default_factory=CLOCK.now)

    kind = RecordKind.APPEND_OUTPUT
    __eq__ = _record_eq
    __hash__ = _record_hash

    def __post_init__(self) -> None:
        _check_common(self)
        _freeze_tokens(self)


Record = AddDocument | DeleteDocument | DeleteCollection | AppendOutput


def _put_str(out: list[bytes], value: str) -> None:
    raw = value.encode("utf-8")
    out += (_U32.pack(len(raw)), raw)


def _put_tokens(out: list[bytes], tokens: np.ndarray) -> None:
    out += (_U32.pack(tokens.shape[0]), tokens.astype(_TOKEN_DTYPE, copy=False).tobytes())


def encode_record(record: Record) -> bytes:
    out = [_HEADER.pack(RECORD_VERSION, record.kind, bytes.fromhex(record.record_id), record.stamp)]
    if isinstance(record, AddDocument):
        for s in (record.namespace, record.collection, record.doc_id, record.text):
            _put_str(out, s)
        _put_str(out, json.dumps(dict(record.metadata), ensure_ascii=False, sort_keys=True))
        _put_tokens(out, record.tokens)
    elif isinstance(record, DeleteDocument):
        for s in (record.namespace, record.collection, record.doc_id):
            _put_str(out, s)
    elif isinstance(record, DeleteCollection):
        _put_str(out, record.namespace)
        _put_str(out, record.collection)
    elif isinstance(record, AppendOutput):
        _put_str(out, record.namespace)
        _put_tokens(out, record.tokens)
    else:
        raise TypeError(f"not a store record: {type(record).__name__}")
    body = b"".join(out)
    return body + _U32.pack(zlib.crc32(body))


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = _HEADER.size

    def take(self, n: int, what: str) -> bytes:
        end = self.pos + n
        if end > len(self.data) - _U32.size:
            raise RecordError(f"record truncated: {what} needs {n} bytes at offset {self.pos}")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def u32(self, what: str) -> int:
        return _U32.unpack(self.take(_U32.size, what))[0]

    def str(self, what: str) -> str:
        raw = self.take(self.u32(what), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RecordError(f"{what} is not valid UTF-8: {exc}") from None

    def tokens(self) -> np.ndarray:
        count = self.u32("tokens")
        raw = self.take(count * _TOKEN_DTYPE.itemsize, "tokens")
        return np.frombuffer(raw, dtype=_TOKEN_DTYPE).astype(np.int32, copy=False)  # read-only view


def decode_record(data: bytes) -> Record:
    """Decode and validate one record; raise ``RecordError`` on any mismatch."""
    data = bytes(data)
    if len(data) < _HEADER.size + _U32.size:
        raise RecordError(f"record truncated: {len(data)} bytes, a record has at least "
                          f"{_HEADER.size + _U32.size}")
    stored = _U32.unpack_from(data, len(data) - _U32.size)[0]
    computed = zlib.crc32(memoryview(data)[: len(data) - _U32.size])
    if stored != computed:
        raise RecordError(f"record CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")
    version, kind, rid, stamp = _HEADER.unpack_from(data)
    if version != RECORD_VERSION:
        raise RecordError(f"unsupported record version {version} (this build reads {RECORD_VERSION})")
    try:
        kind = RecordKind(kind)
    except ValueError:
        raise RecordError(f"unknown record kind {kind}") from None
    r = _Reader(data)
    common = {"record_id": rid.hex(), "stamp": stamp}
    record: Record
    if kind is RecordKind.ADD_DOCUMENT:
        ns, coll, doc_id, text = r.str("namespace"), r.str("collection"), r.str("doc_id"), r.str("text")
        meta_json = r.str("metadata")
        try:
            meta = json.loads(meta_json)
        except ValueError as exc:
            raise RecordError(f"metadata is not valid JSON: {exc}") from None
        record = AddDocument(ns, coll, doc_id, text, r.tokens(), meta, **common)
    elif kind is RecordKind.DELETE_DOCUMENT:
        record = DeleteDocument(r.str("namespace"), r.str("collection"), r.str("doc_id"), **common)
    elif kind is RecordKind.DELETE_COLLECTION:
        record = DeleteCollection(r.str("namespace"), r.str("collection"), **common)
    else:
        record = AppendOutput(r.str("namespace"), r.tokens(), **common)
    if r.pos != len(data) - _U32.size:
        raise RecordError(f"record has {len(data) - _U32.size - r.pos} trailing bytes after its fields")
    return record
