"""Documents for a batch job: a JSONL file (one object per line) or a directory of .txt/.md files.

The reader never stops at a bad line: it yields a :class:`BadInput` naming the line (1-based) and goes
on, so the job decides whether to skip it or abort (``--strict``). Example, with ``--id-field id``::

    1  {"id": "a", "text": "First document."}      -> Document("a", "First document.", line=1)
    2  {"id": "b", "body": "..."}                  -> BadInput(line=2, "no string field 'text'")
    3                                              (blank: ignored)
    4  {"text": "No id here."}                     -> Document("4", "No id here.", line=4)

A missing id falls back to the line number (stable as long as the file is only appended to); a
repeated id is a bad line, because the output file is keyed by id. In a directory, every ``.txt`` and
``.md`` file below it (sorted, recursively) is one document whose id is its relative POSIX path.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TEXT_SUFFIXES", "BadInput", "Document", "read_documents"]

TEXT_SUFFIXES = (".txt", ".md")


@dataclass(frozen=True)
class Document:
    id: str
    text: str
    line: int | None = None  # 1-based line of a JSONL input; None for a file of a directory


@dataclass(frozen=True)
class BadInput:
    """An input line (or directory file) that is not a usable document."""

    source: str  # the input path
    line: int | None
    message: str

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        return f"{where}: {self.message}"


def read_documents(path: str | Path, *, text_field: str = "text",
                   id_field: str = "id") -> Iterator[Document | BadInput]:
    """Documents of a JSONL file or a directory, in input order, with the bad entries in between.
    Raises OSError when ``path`` itself cannot be read."""
    path = Path(path)
    seen: dict[str, str] = {}  # id -> where it first appeared
    items = _read_directory(path) if path.is_dir() else _read_jsonl(path, text_field, id_field)
    for item in items:
        if isinstance(item, Document):
            where = f"line {item.line}" if item.line is not None else repr(item.id)
            if item.id in seen:
                yield BadInput(str(path), item.line, f"duplicate id {item.id!r} (first at {seen[item.id]})")
                continue
            seen[item.id] = where
        yield item


def _read_jsonl(path: Path, text_field: str, id_field: str) -> Iterator[Document | BadInput]:
    with open(path, "rb") as f:  # bytes: one undecodable line must not end the file
        for number, raw in enumerate(f, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte order mark
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield BadInput(str(path), number, f"not UTF-8 ({exc.reason} at byte {exc.start})")
                continue
            if not line.strip():
                continue
            yield _parse_line(str(path), number, line, text_field, id_field)


def _parse_line(source: str, number: int, line: str, text_field: str, id_field: str) -> Document | BadInput:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        return BadInput(source, number, f"not JSON ({exc})")
    if not isinstance(obj, dict):
        return BadInput(source, number, f"expected a JSON object, got {type(obj).__name__}")
    text = obj.get(text_field)
    if not isinstance(text, str):
        return BadInput(source, number, f"no string field {text_field!r}")
    if not text.strip():
        return BadInput(source, number, f"field {text_field!r} is empty")
    raw_id = obj.get(id_field)
    if raw_id is None:
        doc_id = str(number)
    elif isinstance(raw_id, str) and raw_id:
        doc_id = raw_id
    elif isinstance(raw_id, int) and not isinstance(raw_id, bool):
        doc_id = str(raw_id)
    else:
        return BadInput(source, number, f"field {id_field!r} must be a non-empty string or an integer")
    return Document(doc_id, text, number)


def _read_directory(root: Path) -> Iterator[Document | BadInput]:
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in TEXT_SUFFIXES and p.is_file())
    for p in files:
        doc_id = p.relative_to(root).as_posix()
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            yield BadInput(str(p), None, f"cannot read ({exc})")
            continue
        if not text.strip():
            yield BadInput(str(p), None, "empty file")
            continue
        yield Document(doc_id, text)
