"""Tool calling: the constraint a call must follow, the prompt that offers the tools, and reading the
calls back out of the output.

``tool_choice``:

- ``none`` (or no tools): plain generation; the tools are not shown to the model.
- ``required`` / a named function: the output is constrained (a grammar, ``lookupspec.constraints``)
  to one JSON object ``{"name": ..., "arguments": {...}}`` whose arguments follow that tool's
  ``parameters`` schema (any of the tools for ``required``); it always parses into one call.
- ``auto``: the tools go through the model's chat template and the model decides; its output is read
  in the template family's call syntax: Hermes / Qwen ``<tool_call>{json}</tool_call>`` blocks, or
  Llama 3.1's bare JSON object ``{"name": ..., "parameters": {...}}`` (optionally after
  ``<|python_tag|>``). A model whose template takes no tools cannot do this: a 400.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CALL_HEAD", "ToolPlan", "call_schema", "new_call_id", "parse_calls", "render_tool_messages",
           "template_syntax"]

# a constrained call's beginning up to its arguments' first character (which must be there)
CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\S)')
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolPlan:
    """How a request's output turns into tool calls. ``syntax``: ``json`` (the constrained object),
    ``hermes`` or ``llama3`` (``auto``, the template family's own syntax)."""

    syntax: str
    names: tuple[str, ...]


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    return tool.get("function", tool)


def _parameters(tool: Mapping[str, Any]) -> dict[str, Any]:
    params = _function(tool).get("parameters")
    return dict(params) if params else {"type": "object", "properties": {}}


def call_schema(tools: Sequence[Mapping[str, Any]], name: str | None = None) -> dict[str, Any]:
    """The JSON schema of one call: to ``name``, or to any of ``tools``. Example, one tool
    ``get_weather(city: string)``: ``{"type": "object", "properties": {"name": {"const":
    "get_weather"}, "arguments": {...city...}}, "required": ["name", "arguments"]}``."""
    def one(tool: Mapping[str, Any]) -> dict[str, Any]:
        return {"type": "object", "properties": {"name": {"const": _function(tool)["name"]},
                                                 "arguments": _parameters(tool)},
                "required": ["name", "arguments"], "additionalProperties": False}

    chosen = [t for t in tools if name is None or _function(t)["name"] == name]
    if not chosen:
        raise KeyError(name)
    return one(chosen[0]) if len(chosen) == 1 else {"anyOf": [one(t) for t in chosen]}


def template_syntax(chat_template: str | None) -> str | None:
    """The call syntax a chat template teaches its model, None when it takes no tools."""
    if not chat_template or "tools" not in chat_template:
        return None
    if "<tool_call>" in chat_template:
        return "hermes"
    return "llama3"


def render_tool_messages(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
                         constrained: bool) -> list[dict[str, Any]]:
    """Messages for a template that takes no tools: the tools described in a system message (for a
    constrained call, with the object the output must be), earlier calls written into the assistant
    turns as that same JSON, tool results as ``tool`` turns."""
    listing = json.dumps([{"name": _function(t)["name"], "description": _function(t).get("description", ""),
                           "parameters": _parameters(t)} for t in tools], ensure_ascii=False)
    how = ('Reply with one JSON object {"name": <tool name>, "arguments": <its arguments>}.' if constrained
           else "")
    intro = f"You can call these tools: {listing}. {how}".strip()
    out: list[dict[str, Any]] = [{"role": "system", "content": intro}]
    for m in messages:
        content = m.get("content") or ""
        calls = m.get("tool_calls")
        if calls:
            content = "\n".join(json.dumps({"name": c["function"]["name"],
                                            "arguments": _arguments(c["function"].get("arguments"))},
                                           ensure_ascii=False) for c in calls)
        out.append({"role": m["role"], "content": content})
    return out


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def new_call_id() -> str:
    """A tool call's id, in OpenAI's form (``call_`` and 24 characters)."""
    return "call_" + uuid.uuid4().hex[:24]


def _call(name: str, arguments: Any) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {},
                                                                    ensure_ascii=False)
    return {"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": args}}


def _raw_arguments(text: str) -> str | None:
    """The arguments' text of a constrained call as the model wrote it (``{"name": ..., "arguments":
    <value>}``; the streamed fragments join to the same text); None where the layout differs."""
    m = CALL_HEAD.match(text)
    if m is None:
        return None
    try:
        _, end = json.JSONDecoder().raw_decode(text, m.end())
    except json.JSONDecodeError:
        return None
    return text[m.end():end]


def parse_calls(text: str, plan: ToolPlan) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool calls) of one output. A constrained output is exactly one call; in ``auto``
    text that holds no well-formed call to a known tool is plain content."""
    if plan.syntax == "json":
        try:  # cut by max_tokens, the object may be unfinished: then it is content
            obj = json.loads(text)
        except json.JSONDecodeError:
            return text, []
        raw = _raw_arguments(text)
        return None, [_call(obj["name"], raw if raw is not None else obj.get("arguments"))]
    if plan.syntax == "hermes":
        calls = []
        for block in _HERMES.findall(text):
            try:
                obj = json.loads(block)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and obj.get("name") in plan.names:
                calls.append(_call(obj["name"], obj.get("arguments", obj.get("parameters"))))
        if not calls:
            return text, []
        rest = _HERMES.sub("", text).strip()
        return rest or None, calls
    body = text.strip().removeprefix("<|python_tag|>").strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return text, []
    if isinstance(obj, dict) and obj.get("name") in plan.names:
        return None, [_call(obj["name"], obj.get("parameters", obj.get("arguments")))]
    return text, []
