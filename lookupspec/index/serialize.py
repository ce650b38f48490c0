"""The byte format shared by every store's ``to_bytes`` / ``from_bytes``.

Layout (little-endian)::

    header  magic b"LKSPIDX1" | u16 format version | u16 len(kind) | u64 payload length | u32 crc32
    kind    utf-8 store kind ("context", "corpus", "output")
    payload u32 len(meta) | meta (utf-8 JSON object, with "arrays": [[dtype, length], ...])
            | the arrays' raw bytes, in that order, nothing after

``unpack`` checks, in order: length of the header, magic, version, kind, payload length, CRC32 of
the payload, the JSON, the array table (known dtypes, lengths that add up to the bytes present).
Any failure raises ``CorruptIndexError`` (a ``ValueError``). Arrays come back as fresh, aligned,
writable copies, so a store never points numba at untrusted memory layouts; each store then
validates the *contents* (ranges, sortedness) before any numba kernel indexes with them.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np

__all__ = ["FORMAT_VERSION", "CorruptIndexError", "pack", "unpack"]

MAGIC = b"LKSPIDX1"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sHHQI")
_DTYPES: dict[str, np.dtype] = {"int32": np.dtype("<i4"), "int64": np.dtype("<i8"), "bool": np.dtype("bool")}


class CorruptIndexError(ValueError):
    """Serialized store bytes that are truncated, corrupted, of another kind or another version."""


def pack(kind: str, meta: dict[str, Any], arrays: list[np.ndarray]) -> bytes:
    table: list[list[Any]] = []
    for a in arrays:
        name = next((k for k, v in _DTYPES.items() if v == a.dtype.newbyteorder("<")), None)
        if name is None or a.ndim != 1:
            raise TypeError(f"cannot serialize array of dtype {a.dtype} and ndim {a.ndim}")
        table.append([name, int(a.shape[0])])
    meta_b = json.dumps({**meta, "arrays": table}, separators=(",", ":")).encode()
    parts = [struct.pack("<I", len(meta_b)), meta_b]
    parts += [np.ascontiguousarray(a, dtype=_DTYPES[t[0]]).tobytes()
              for a, t in zip(arrays, table, strict=True)]
    payload = b"".join(parts)
    kind_b = kind.encode()
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, len(kind_b), len(payload), zlib.crc32(payload))
    return head + kind_b + payload


def unpack(data: bytes, kind: str,
           dtypes: list[str] | None = None) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Parse and check ``data``; ``dtypes`` (if given) is the exact dtype list the caller expects."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    buf = memoryview(data).cast("B")
    if len(buf) < _HEADER.size:
        raise CorruptIndexError(f"truncated: {len(buf)} bytes is shorter than the header")
    magic, version, klen, plen, crc = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise CorruptIndexError("not a lookupspec store (bad magic)")
    if version != FORMAT_VERSION:
        raise CorruptIndexError(f"unsupported store format version {version} (this build reads "
                                f"{FORMAT_VERSION})")
    start = _HEADER.size + klen
    if len(buf) < start:
        raise CorruptIndexError("truncated store kind")
    got_kind = bytes(buf[_HEADER.size:start]).decode("utf-8", errors="replace")
    if got_kind != kind:
        raise CorruptIndexError(f"expected a {kind!r} store, got {got_kind!r}")
    if len(buf) != start + plen:
        raise CorruptIndexError(f"truncated or padded: payload is {len(buf) - start} bytes, "
                                f"header says {plen}")
    payload = buf[start:]
    if zlib.crc32(payload) != crc:
        raise CorruptIndexError("checksum mismatch: the bytes are corrupted")
    if plen < 4:
        raise CorruptIndexError("payload too short")
    (mlen,) = struct.unpack_from("<I", payload, 0)
    if 4 + mlen > plen:
        raise CorruptIndexError("metadata length exceeds payload")
    try:
        meta = json.loads(bytes(payload[4:4 + mlen]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptIndexError(f"bad metadata: {e}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("arrays"), list):
        raise CorruptIndexError("bad metadata: no array table")
    arrays = []
    off = 4 + mlen
    for entry in meta["arrays"]:
        if (not isinstance(entry, list) or len(entry) != 2 or entry[0] not in _DTYPES
                or not isinstance(entry[1], int) or entry[1] < 0):
            raise CorruptIndexError(f"bad array table entry {entry!r}")
        dt = _DTYPES[entry[0]]
        nbytes = entry[1] * dt.itemsize
        if off + nbytes > plen:
            raise CorruptIndexError("array data truncated")
        arrays.append(np.frombuffer(payload[off:off + nbytes], dtype=dt).astype(dt.newbyteorder("=")))
        off += nbytes
    if off != plen:
        raise CorruptIndexError("trailing bytes after the arrays")
    if dtypes is not None and [e[0] for e in meta["arrays"]] != dtypes:
        raise CorruptIndexError(f"unexpected array layout {meta['arrays']!r}")
    return meta, arrays
