"""Reading an OpenAI-style Server-Sent Events stream: one parser for the gateway client and the HTTP
benchmarks.

Every event is a ``data: {json}`` line; lines that carry no data (blank, ``: comment``, ``event:``,
``id:``) are skipped and ``data: [DONE]`` ends the stream. ``StreamState`` follows choice 0 of a
completion or chat stream: its text, ``finish_reason``, the ``usage`` chunk, lookupspec's
``speculation`` object (on the chunk that ends the choice, and the request's on the usage chunk), and
an ``{"error": ...}`` event (an object, as OpenAI and lookupspec send it, or a string, as
``transformers serve`` does), which ends the stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DONE", "StreamState", "parse_sse_line"]

DONE = "[DONE]"


def parse_sse_line(line: str) -> dict[str, Any] | str | None:
    """One line of an SSE body: the event's JSON object, ``DONE``, or None for a line that carries no
    data. ``data:`` may be followed by a space or not."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload:
        return None
    if payload == DONE:
        return DONE
    obj = json.loads(payload)
    if not isinstance(obj, dict):
        raise ValueError(f"an SSE data event that is not a JSON object: {payload[:200]!r}")
    return obj


@dataclass
class StreamState:
    """Choice 0 of one stream, event by event (``feed``)."""

    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    speculation: dict[str, Any] | None = None
    error: dict[str, Any] | None = None  # {"message", "param"?, "code"?}
    usage_seen: bool = False  # the closing usage chunk (``stream_options.include_usage``) arrived
    texts: list[str] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # choice 0's, deltas merged by index

    def feed(self, event: dict[str, Any]) -> str | None:
        """Record one data event; return the text it adds to choice 0 (None: none). An error event is
        recorded in ``error`` (the stream is over)."""
        if "error" in event:
            err = event["error"]
            self.error = dict(err) if isinstance(err, dict) else {"message": str(err)}
            return None
        if event.get("usage"):
            self.usage = event["usage"]
            if not event.get("choices"):
                self.usage_seen = True
                if event.get("speculation"):
                    self.speculation = event["speculation"]  # the request's
        text = None
        for choice in event.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(delta, dict) and delta.get("tool_calls"):
                self._merge_calls(delta["tool_calls"])
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                if event.get("speculation") and self.speculation is None:
                    self.speculation = event["speculation"]  # the choice's, when no usage chunk follows
        if text:
            self.texts.append(text)
            return text
        return None

    def _merge_calls(self, deltas: list[dict[str, Any]]) -> None:
        """OpenAI's streamed tool calls: the first delta of a call has its id, type and name, later
        ones append to ``function.arguments``."""
        for d in deltas:
            k = int(d.get("index", 0))
            while len(self.tool_calls) <= k:
                self.tool_calls.append({"id": None, "type": "function",
                                        "function": {"name": "", "arguments": ""}})
            call = self.tool_calls[k]
            call["id"] = d.get("id") or call["id"]
            fn = d.get("function") or {}
            call["function"]["name"] += fn.get("name") or ""
            call["function"]["arguments"] += fn.get("arguments") or ""
