"""Spill files: where a Redis replica keeps, across a planned stop, the appends it acknowledged as
``buffered`` while Redis was unreachable.

A write acknowledged with ``buffered: true`` is a promise. When the replica stops gracefully before
Redis returns, ``RedisLog.close`` writes what is still buffered to a spill file in the data
directory; the next replica that starts with that directory takes the file over, applies its records
and writes them to Redis with the rest of its buffer. Only a kill -9 (or a lost disk) during an
outage can still lose a buffered write.

Files are ``spill-<prefix hash>-<random>.frames`` (the hash of the Redis key prefix, so deployments
sharing a directory never take each other's records), holding frames in the embedded log's format
(magic, length, header CRC, encoded record). A file is complete when it has its final name: it is
written under a temporary name, fsync'd and renamed. A replica takes a file over by holding an
exclusive ``flock`` on it until all its records reached Redis, then deletes it; another replica
starting meanwhile skips a locked file. Several replicas may therefore share one data directory.
Taking over a file twice (a crash between flushing and deleting) only re-sends records, which
``StoreState.apply`` ignores by record id.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .embedded import encode_frame, read_frame
from .records import Record, RecordError

__all__ = ["SpillDir", "TakenOver"]

log = logging.getLogger(__name__)


@dataclass
class TakenOver:
    """Spill files this replica holds (locked) and the records they held, oldest file first."""

    records: list[Record] = field(default_factory=list)
    files: list[tuple[Path, int]] = field(default_factory=list)  # (path, locked descriptor)
    damaged: int = 0  # frames that did not decode (skipped)

    def release(self, *, delete: bool) -> None:
        """Unlock the files, deleting them first when their records are safe elsewhere."""
        for path, fd in self.files:
            if delete:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            os.close(fd)
        self.files.clear()


class SpillDir:
    def __init__(self, directory: Path, key_prefix: str) -> None:
        self.directory = Path(directory)
        self.tag = hashlib.sha256(key_prefix.encode()).hexdigest()[:12]

    def _pattern(self) -> str:
        return f"spill-{self.tag}-*.frames"

    def write(self, payloads: Sequence[bytes]) -> Path:
        """Write encoded records to a new spill file (durable when this returns)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"spill-{self.tag}-{uuid.uuid4().hex}.frames"
        tmp = self.directory / f".{name}.tmp"
        with open(tmp, "wb") as f:
            for payload in payloads:
                f.write(encode_frame(payload))
            f.flush()
            os.fsync(f.fileno())
        final = self.directory / name
        os.replace(tmp, final)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return final

    def take_over(self) -> TakenOver:
        """Lock and read every spill file of this key prefix that no live replica holds."""
        out = TakenOver()
        if not self.directory.is_dir():
            return out
        for path in sorted(self.directory.glob(self._pattern()), key=lambda p: p.stat().st_mtime_ns):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # taken over and deleted by another replica meanwhile
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                # The file may have been deleted between our open and our lock (its holder finished).
                if os.fstat(fd).st_ino != os.stat(path).st_ino:
                    raise FileNotFoundError(path)
                data = os.read(fd, os.fstat(fd).st_size)
            except (BlockingIOError, FileNotFoundError):
                os.close(fd)
                continue
            pos = 0
            while pos < len(data):
                try:
                    record, pos = read_frame(data, pos)
                except RecordError as exc:  # written whole and fsync'd, so this is disk damage
                    out.damaged += 1
                    log.error("spill file %s damaged at byte %d (%s): the rest of it is skipped",
                              path, pos, exc)
                    break
                out.records.append(record)
            out.files.append((path, fd))
        return out
