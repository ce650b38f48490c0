"""The job's output: an append-only JSONL file, one object per finished document, that survives kills.

Invariant: after every :meth:`OutputFile.append` returns, the file is valid JSONL on disk (the line
and its newline go out in one ``write`` on an ``O_APPEND`` descriptor, then ``fsync``). A process
killed inside that write can leave at most one torn last line; :meth:`OutputFile.open` repairs it by
truncating the file back to the last complete line, and collects the ids already done, so a rerun
skips them. Example: a file holding ``{"id": "a", ...}\\n{"id": "b", "summ`` is truncated to its first
line and reports ``done = {"a"}``; document ``b`` is summarized again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["OutputFile", "Recovery", "read_records"]


@dataclass
class Recovery:
    """What opening an existing output file found."""

    done: set[str] = field(default_factory=set)  # ids with a complete line
    lines: int = 0  # complete lines kept
    truncated_bytes: int = 0  # size of the torn last line that was cut off (0: none)
    bad_lines: list[int] = field(default_factory=list)  # 1-based, complete but unreadable lines kept


class OutputFile:
    """Append-only JSONL writer: ``flush`` + ``fsync`` per line. Not thread-safe: one writer thread."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    @classmethod
    def open(cls, path: str | Path) -> tuple[OutputFile, Recovery]:
        """Open (creating it and its directory if needed) and repair ``path``; see the module docstring."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        recovery = Recovery()
        if path.exists():
            recovery = _scan(path.read_bytes())
            if recovery.truncated_bytes:
                with open(path, "r+b") as f:
                    f.truncate(path.stat().st_size - recovery.truncated_bytes)
                    f.flush()
                    os.fsync(f.fileno())
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return cls(path, fd), recovery

    def append(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:  # a regular file takes it in one write; loop for the general contract of write(2)
            n = os.write(self._fd, view)
            view = view[n:]
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> OutputFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete result line of an output file, in file order (unreadable lines and a torn last
    line are left out; a missing file has none)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in data.split(b"\n")[:-1]:  # the part after the last newline is not a complete line
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("id"), str):
            out.append(obj)
    return out


def _scan(data: bytes) -> Recovery:
    """Done ids of an output file's bytes, and how many trailing bytes form a torn line.

    The last line is torn when it does not end in a newline or does not parse; a complete line that
    does not parse anywhere else is kept (and reported) rather than rewritten: the file is append-only.
    """
    out = Recovery()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the data ends with a newline
    parsed = [_record_id(line) for line in lines]
    if tail:
        out.truncated_bytes = len(tail)
    elif parsed and parsed[-1] is None and lines[-1].strip():
        out.truncated_bytes = len(lines[-1]) + 1  # an unreadable last line: torn all the same
        parsed.pop()
        lines.pop()
    for number, (line, doc_id) in enumerate(zip(lines, parsed, strict=True), start=1):
        if doc_id is not None:
            out.done.add(doc_id)
            out.lines += 1
        elif line.strip():
            out.bad_lines.append(number)
    return out


def _record_id(line: bytes) -> str | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    doc_id = obj.get("id") if isinstance(obj, dict) else None
    return doc_id if isinstance(doc_id, str) else None
