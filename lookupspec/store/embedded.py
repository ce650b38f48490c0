"""Embedded backend (the default, no services): an append-only log file under the data directory.

File layout: a sequence of frames, each::

    4B  magic b"LSR1"
    u32 payload length (LE)
    u32 CRC32 of the 8 bytes above (LE)
    payload: one encoded record (records.py; carries its own version byte and CRC32)

Acknowledged means durable: ``append`` writes the whole frame with one ``write`` on an O_APPEND
descriptor and returns only after ``fsync`` (and, for a new file, an fsync of the directory), so a
kill -9 or power loss after the return cannot lose the record. A lock file (``flock``) keeps a second
process from writing the same log.

Damage handling at ``replay`` (a frame whose header or payload fails its CRC, or that is cut short):

- *Torn or corrupt tail* (no valid frame after the damage; the usual kill -9 mid-write case): the tail
  is copied to ``store.log.corrupt-<ns>`` for inspection and the log is truncated to the last valid
  frame, so later appends start on a clean frame boundary. Nothing acknowledged is lost: a frame is
  acknowledged only after it was completely written and synced.
- *Damage in the middle* (a bit flip with valid frames after it): we **resync** to the next offset
  holding a frame whose header CRC, payload CRC and decoding all check, skip the damaged bytes and go
  on. Truncating there instead would discard every acknowledged record after the flip. The damaged
  bytes stay in the file (rewriting a live log is riskier than re-skipping them) and are reported
  again at every start-up.

Both cases are logged and counted in ``health()`` (``corrupt_regions``, ``skipped_bytes``,
``truncated_bytes``, ``last_error``); neither is fatal. A false resync would need both CRCs of a
forged frame to match right after a damaged region; we accept that risk.

Compaction. Replacing a document leaves its old record in the log, so a log under churn grows without
bound while the live state does not. ``compact(live)`` rewrites the log as the live records (a
snapshot, ``StoreState.live_records``), after which appends go on as the tail:

1. write the snapshot's frames to ``store.log.compact`` (a new file), fsync it;
2. ``rename`` it over ``store.log`` (atomic), fsync the directory;
3. append to the new file from then on.

A kill -9 before step 2 leaves the old log whole (the half-written ``.compact`` file is deleted at the
next open); after it, the new log is whole. Either way replay gives the same state, so nothing
acknowledged is lost. The caller (``Store``) compacts only while no append is between the log and the
state, so the snapshot holds every record in the log. ``compaction_due(live)`` says when: the log
holds more than ``compact_ratio`` times as many records as the live state, and at least
``compact_min_records``, so the log stays within a constant factor of the live state and each
compaction's cost is paid for by as many appends. (Damaged regions the replay skipped are not
carried over.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import struct
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import AppendAck, ApplyFn, StoreClosedError, StoreError, StoreLockedError
from .records import Record, RecordError, decode_record, encode_record

__all__ = ["EmbeddedConfig", "EmbeddedLog"]

log = logging.getLogger(__name__)

MAGIC = b"LSR1"
_FRAME = struct.Struct("<4sII")  # magic, payload length, CRC32 of (magic + length)
MAX_RECORD_BYTES = 1 << 30  # frames claiming more are treated as damage


@dataclass(frozen=True)
class EmbeddedConfig:
    data_dir: Path
    log_name: str = "store.log"
    fsync: bool = True  # False only for throwaway test data: acknowledgements are then not durable
    compact_min_records: int = 10_000  # no compaction below this many records in the log
    compact_ratio: float = 2.0  # compact when the log holds more than ratio x the live records; 0: never

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if not self.log_name or "/" in self.log_name or self.log_name.startswith("."):
            raise ValueError(f"log_name must be a plain file name, got {self.log_name!r}")
        if self.compact_min_records < 1 or not (self.compact_ratio == 0 or self.compact_ratio > 1):
            raise ValueError(f"need compact_min_records >= 1 and compact_ratio 0 (off) or > 1, got "
                             f"{self.compact_min_records} and {self.compact_ratio}")

    @property
    def compact_path(self) -> Path:
        return self.data_dir / (self.log_name + ".compact")

    @property
    def log_path(self) -> Path:
        return self.data_dir / self.log_name

    @property
    def lock_path(self) -> Path:
        return self.data_dir / (self.log_name + ".lock")


def encode_frame(payload: bytes) -> bytes:
    head = MAGIC + struct.pack("<I", len(payload))
    return head + struct.pack("<I", zlib.crc32(head)) + payload


def read_frame(buf: mmap.mmap | bytes, pos: int) -> tuple[Record, int]:
    """Decode the frame at ``pos``; return (record, end offset). Raises RecordError on damage."""
    if pos + _FRAME.size > len(buf):
        raise RecordError(f"frame header cut short ({len(buf) - pos} bytes)")
    magic, length, crc = _FRAME.unpack_from(buf, pos)
    if magic != MAGIC:
        raise RecordError(f"bad frame magic {bytes(magic)!r}")
    if zlib.crc32(buf[pos : pos + 8]) != crc:
        raise RecordError("frame header CRC mismatch")
    if length > MAX_RECORD_BYTES:
        raise RecordError(f"frame length {length} exceeds the limit")
    end = pos + _FRAME.size + length
    if end > len(buf):
        raise RecordError(f"frame cut short: {len(buf) - pos - _FRAME.size} of {length} payload bytes")
    return decode_record(buf[pos + _FRAME.size : end]), end


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # os.write may write less than asked (e.g. on a full disk)
        view = view[os.write(fd, view):]


def _lock_holder(lock_path: Path) -> str:
    """Who holds the lock, for the error message: the pid its holder wrote into the lock file, and
    that process's command line where /proc shows it (``make serve`` names its port there)."""
    try:
        pid = int(lock_path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return "another process"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"process {pid}"
    command = " ".join(a.decode(errors="replace") for a in argv if a)
    return f"process {pid} ({command})" if command else f"process {pid}"


class EmbeddedLog:
    """See the module docstring. Thread-safe appends; one process per data directory."""

    def __init__(self, config: EmbeddedConfig) -> None:
        self.config = config
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._lock_fd = os.open(config.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreLockedError(
                    f"{config.log_path} is in use by {_lock_holder(config.lock_path)} (lock "
                    f"{config.lock_path}); one process per data directory: start another server with "
                    "its own, `lookupspec serve --data-dir DIR` (or LOOKUPSPEC_DATA_DIR)") from None
            raise
        os.ftruncate(self._lock_fd, 0)
        os.write(self._lock_fd, f"{os.getpid()}\n".encode())
        # A compaction killed before its rename: the log itself is whole, the copy is not.
        with contextlib.suppress(FileNotFoundError):
            config.compact_path.unlink()
        created = not config.log_path.exists()
        self._fd: int | None = os.open(config.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if created and config.fsync:
            self._fsync_dir()
        self._size = os.fstat(self._fd).st_size
        self.appended = 0
        self.replayed = 0
        self.corrupt_regions = 0
        self.skipped_bytes = 0
        self.truncated_bytes = 0
        self.last_error: str | None = None
        self.write_errors = 0
        self._write_failing = False  # the last append failed: degraded until one succeeds
        self.records = 0  # frames in the log file (replayed + appended since the last compaction)
        self.compactions = 0
        self.compacted_records = 0  # records the compactions dropped

    def _fsync_dir(self) -> None:
        dir_fd = os.open(self.config.data_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def append(self, record: Record) -> AppendAck:
        """Write the record's frame and fsync; return once it is durable (see module docstring).
        Raises ``StoreError`` if the write fails (nothing of it is then in the log, and the log
        reports degraded until a later append succeeds)."""
        return self.append_many([record])[0]

    def append_many(self, records: Sequence[Record]) -> list[AppendAck]:
        """Append a batch with one write and one fsync (a documents upload is one batch); all
        records are durable when this returns, or none is in the log and it raises."""
        frames = [encode_frame(encode_record(record)) for record in records]
        with self._lock:
            if self._fd is None:
                raise StoreClosedError("the embedded log is closed")
            start = self._size
            try:
                _write_all(self._fd, b"".join(frames))
                if self.config.fsync:
                    os.fsync(self._fd)
            except OSError as exc:
                self.write_errors += 1
                self._write_failing = True
                self.last_error = f"append failed: {exc}"
                # Cut off what was written so the next append starts on a frame boundary.
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, start)
                raise StoreError(self.last_error) from exc
            acks, offset = [], start
            for record, frame in zip(records, frames, strict=True):
                acks.append(AppendAck(record.record_id, str(offset)))
                offset += len(frame)
            self._size = offset
            self._write_failing = False
            self.appended += len(records)
            self.records += len(records)
        return acks

    def compaction_due(self, live: int) -> bool:
        """Whether the log holds enough dead records to compact, given ``live`` records in the state."""
        ratio = self.config.compact_ratio
        return bool(ratio) and self.records >= self.config.compact_min_records and self.records > ratio * live

    def compact(self, live: Sequence[Record]) -> None:
        """Replace the log by ``live`` (module docstring). The caller guarantees that every record in
        the log is reflected in ``live`` and that no append runs meanwhile. Raises ``StoreError`` if it
        fails (the old log is then untouched and stays in use)."""
        path, tmp = self.config.log_path, self.config.compact_path
        with self._lock:
            if self._fd is None:
                raise StoreClosedError("the embedded log is closed")
            started = time.perf_counter()
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    size, batch = 0, []
                    for record in live:
                        batch.append(encode_frame(encode_record(record)))
                        if len(batch) >= 256:
                            _write_all(fd, b"".join(batch))
                            size += sum(map(len, batch))
                            batch = []
                    _write_all(fd, b"".join(batch))
                    size += sum(map(len, batch))
                    if self.config.fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, path)
                if self.config.fsync:
                    self._fsync_dir()
            except OSError as exc:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                self.last_error = f"compaction failed: {exc}"
                log.warning("store log %s: %s", path, self.last_error)
                raise StoreError(self.last_error) from exc
            old, self._fd = self._fd, os.open(path, os.O_WRONLY | os.O_APPEND)
            os.close(old)
            dropped = self.records - len(live)
            log.info("store log %s compacted: %d records -> %d (%d bytes -> %d) in %.2f s", path,
                     self.records, len(live), self._size, size, time.perf_counter() - started)
            self.compactions += 1
            self.compacted_records += max(dropped, 0)
            self.records, self._size = len(live), size

    def replay(self, apply: ApplyFn) -> int:
        """Apply every valid record in file order; skip and report damage (module docstring)."""
        with self._lock:
            if self._fd is None:
                raise StoreClosedError("the embedded log is closed")
            size = os.fstat(self._fd).st_size
            if size == 0:
                return 0
            count = 0
            with open(self.config.log_path, "rb") as f, \
                    mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
                pos = 0
                while pos < size:
                    try:
                        record, end = read_frame(mm, pos)
                    except RecordError as exc:
                        nxt = self._resync(mm, pos + 1)
                        if nxt is None:
                            self._truncate_tail(mm, pos, size, exc)
                            size = pos
                            break
                        self._report(f"corrupt region at bytes {pos}..{nxt} skipped ({exc})")
                        self.corrupt_regions += 1
                        self.skipped_bytes += nxt - pos
                        pos = nxt
                        continue
                    apply(record)
                    count += 1
                    pos = end
            self._size = size
            self.replayed += count
            self.records = count
            return count

    @staticmethod
    def _resync(mm: mmap.mmap, start: int) -> int | None:
        pos = mm.find(MAGIC, start)
        while pos != -1:
            try:
                read_frame(mm, pos)
                return pos
            except RecordError:
                pos = mm.find(MAGIC, pos + 1)
        return None

    def _truncate_tail(self, mm: mmap.mmap, pos: int, size: int, exc: Exception) -> None:
        assert self._fd is not None
        keep = self.config.log_path.with_name(f"{self.config.log_name}.corrupt-{time.time_ns()}")
        keep.write_bytes(mm[pos:size])
        os.ftruncate(self._fd, pos)
        if self.config.fsync:
            os.fsync(self._fd)
        self.corrupt_regions += 1
        self.truncated_bytes += size - pos
        self._report(f"torn or corrupt tail at byte {pos} ({size - pos} bytes, {exc}): "
                     f"truncated, saved to {keep.name}")

    def _report(self, message: str) -> None:
        self.last_error = message
        log.warning("store log %s: %s", self.config.log_path, message)

    def start_following(self, apply: ApplyFn) -> None:
        """Nothing to follow: this process is the log's only writer (the lock file ensures it)."""

    def stop(self) -> None:
        pass

    def health(self) -> dict[str, Any]:
        return {
            "backend": "embedded",
            # Skipped damage is reported, not degrading: every acknowledged record that survives
            # on disk is served. A failed write is degrading until a later write succeeds.
            "state": "degraded" if self._write_failing else "ok",
            "synced": True,  # this process is the log's only writer: replayed means up to date
            "buffered": 0,
            "overflow": 0,
            "lag_s": 0.0,
            "last_error": self.last_error,
            "appended": self.appended,
            "write_errors": self.write_errors,
            "replayed": self.replayed,
            "corrupt_regions": self.corrupt_regions,
            "skipped_bytes": self.skipped_bytes,
            "truncated_bytes": self.truncated_bytes,
            "log_bytes": self._size,
            "log_records": self.records,
            "compactions": self.compactions,
            "compacted_records": self.compacted_records,
            "path": str(self.config.log_path),
        }

    def close(self) -> None:
        with self._lock:
            if self._fd is None:
                return
            os.close(self._fd)
            self._fd = None
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
