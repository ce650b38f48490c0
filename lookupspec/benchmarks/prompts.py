"""Benchmark prompt files: JSONL rows ``{"id", "kind", "messages"}`` with chat messages, and optionally
``response_format`` (OpenAI's shape: ``{"type": "json_schema", "json_schema": {"name", "schema",
"strict"}}`` or ``{"type": "json_object"}``), which constrains that prompt's output: the benchmarks
send it with the prompt and check every output against it (``fixtures/bench/extraction.jsonl``).

``select_prompts`` filters by kind and takes ``limit`` rows round-robin across kinds (in the order
the kinds first appear), so ``--limit 8`` on a four-kind file gives two prompts of each kind whatever
the file's row order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_PROMPTS", "EXTRACTION_PROMPTS", "KINDS", "BenchPrompt", "check_response_format",
           "load_prompts", "select_prompts"]

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "fixtures" / "bench" / "prompts.jsonl"
EXTRACTION_PROMPTS = DEFAULT_PROMPTS.with_name("extraction.jsonl")
KINDS = ("summarize", "rag_qa", "code_edit", "creative")  # the default set's kinds
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    kind: str
    messages: tuple[dict[str, str], ...]
    response_format: dict[str, Any] | None = None  # OpenAI's shape; None: free text

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON schema its output must follow (None: free text or any JSON object)."""
        rf = self.response_format
        return None if rf is None or rf["type"] != "json_schema" else rf["json_schema"]["schema"]


def check_response_format(rf: object) -> dict[str, Any] | None:
    """A row's ``response_format`` in OpenAI's shape, or None for ``{"type": "text"}``; raises
    ``ValueError`` saying what is wrong (whether the schema compiles is checked against a tokenizer,
    where the benchmarks load the model)."""
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise ValueError("'response_format' must be an object whose type is text, json_object or json_schema")
    if rf["type"] == "text":
        return None
    if rf["type"] == "json_object":
        return {"type": "json_object"}
    js = rf.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
        raise ValueError("'response_format.json_schema.schema' must be a JSON schema object")
    if not isinstance(js.get("name", ""), str) or not isinstance(js.get("strict", False), bool):
        raise ValueError("'response_format.json_schema' name must be a string and strict a boolean")
    return {"type": "json_schema", "json_schema": dict(js)}


def _check_row(row: object, where: str) -> BenchPrompt:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row must be a JSON object")
    for key in ("id", "kind", "messages"):
        if key not in row:
            raise ValueError(f"{where}: missing {key!r}")
    if not isinstance(row["id"], str) or not row["id"] or not isinstance(row["kind"], str) or not row["kind"]:
        raise ValueError(f"{where}: 'id' and 'kind' must be non-empty strings")
    messages = row["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: 'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if (not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str)
                or not m["content"].strip()):
            raise ValueError(f"{where}: messages[{i}] must be {{'role': one of {ROLES}, 'content': text}}")
    if messages[-1]["role"] != "user":
        raise ValueError(f"{where}: the last message must be the user's")
    try:
        rf = check_response_format(row["response_format"]) if "response_format" in row else None
    except ValueError as exc:
        raise ValueError(f"{where} ({row['id']}): {exc}") from None
    return BenchPrompt(row["id"], row["kind"], tuple({"role": m["role"], "content": m["content"]}
                                                    for m in messages), rf)


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    """Read and validate a prompt file; raises ``ValueError`` naming the bad line."""
    path = Path(path)
    prompts: list[BenchPrompt] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not JSON ({exc.msg})") from exc
            prompt = _check_row(row, where)
            if prompt.id in seen:
                raise ValueError(f"{where}: duplicate id {prompt.id!r}")
            seen.add(prompt.id)
            prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


def select_prompts(prompts: Sequence[BenchPrompt], kinds: Sequence[str] | None = None,
                   limit: int | None = None) -> list[BenchPrompt]:
    """Prompts of the given kinds (all when None), at most ``limit`` taken round-robin across kinds.
    Example: kinds a, a, b, b, c with limit 3 -> a1, b1, c1."""
    if kinds:
        unknown = set(kinds) - {p.kind for p in prompts}
        if unknown:
            raise ValueError(f"no prompts of kind {', '.join(sorted(unknown))}")
        prompts = [p for p in prompts if p.kind in kinds]
    by_kind: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        by_kind.setdefault(p.kind, []).append(p)
    ordered: list[BenchPrompt] = []
    for i in range(max((len(v) for v in by_kind.values()), default=0)):
        ordered.extend(v[i] for v in by_kind.values() if i < len(v))
    return ordered[:limit] if limit is not None else ordered
