"""Streaming a constrained tool call's arguments as they are generated, in OpenAI's delta shape.

A ``required`` / named ``tool_choice`` constrains the output to ``{"name": "<tool>", "arguments":
<value>}`` (``lookupspec.service.tools``; the name always comes first). :class:`CallStream` reads that
text piece by piece and turns it into ``delta.tool_calls`` entries:

1. once the name and the ``"arguments": `` key are complete, one entry with ``index``, ``id``,
   ``type`` and ``function.name``, with ``function.arguments`` empty;
2. then entries carrying ``function.arguments`` fragments, the arguments' text as the model writes it,
   as soon as it arrives (an object or array value ends where its brackets balance, so the call's
   closing ``}`` is never sent; a scalar value is sent whole at the end);
3. :meth:`CallStream.finish` sends what is left and says whether the call is complete.

The fragments joined are exactly the ``function.arguments`` of the same output read whole
(:func:`lookupspec.service.tools.parse_calls`). Worked example, pieces ``{"name": "f", "arg``,
``uments": {"city": "Os``, ``lo"}}``: nothing; the header and ``{"city": "Os``; ``lo"}``.
"""

from __future__ import annotations

import json
from typing import Any

from .tools import CALL_HEAD, new_call_id

__all__ = ["CallStream"]


class CallStream:
    """One choice's constrained call, read as it streams (see the module docstring)."""

    def __init__(self) -> None:
        self.text = ""
        self.call_id: str | None = None  # set when the header entry went out
        self._start = 0  # where the arguments begin in ``text``
        self._scanned = 0  # characters of the arguments scanned for their end
        self._sent = 0  # characters of the arguments sent
        self._end: int | None = None  # where an object/array value ends (relative to ``_start``)
        self._depth = 0
        self._in_string = False
        self._escape = False

    @property
    def started(self) -> bool:
        """The header entry went out: from here on the choice is a tool call."""
        return self.call_id is not None

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The ``delta.tool_calls`` entries the new ``text`` completes (often none)."""
        self.text += text
        out: list[dict[str, Any]] = []
        if self.call_id is None:
            m = CALL_HEAD.match(self.text)  # complete up to the arguments' first character
            if m is None:
                return out
            try:
                name = json.loads(m.group(1))
            except json.JSONDecodeError:
                return out
            self.call_id, self._start = new_call_id(), m.end()
            out.append({"index": 0, "id": self.call_id, "type": "function",
                        "function": {"name": name, "arguments": ""}})
        fragment = self._fragment()
        if fragment:
            out.append({"index": 0, "function": {"arguments": fragment}})
        return out

    def finish(self) -> tuple[list[dict[str, Any]], bool]:
        """The last entries (the rest of the arguments) and whether the call is complete (its text
        parses; a call cut by ``max_tokens`` is not). Only for a started call."""
        body = self.text[self._start:]
        end = self._end
        if end is None:  # a scalar value (or an unfinished one): it runs to the call's last "}"
            try:
                _, stop = json.JSONDecoder().raw_decode(self.text, self._start)
                end = stop - self._start
            except json.JSONDecodeError:
                end = len(body)
        rest = body[self._sent:end]
        self._sent = end
        try:
            complete = isinstance(json.loads(self.text), dict)
        except json.JSONDecodeError:
            complete = False
        return ([{"index": 0, "function": {"arguments": rest}}] if rest else []), complete

    def _fragment(self) -> str:
        """Scan the arguments that arrived; the part of an object/array value not sent yet."""
        body = self.text[self._start:]
        if not body or body[0] not in "{[":
            return ""  # a scalar is sent whole by finish()
        j = self._scanned
        while self._end is None and j < len(body):
            c = body[j]
            j += 1
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._end = j
        self._scanned = j
        limit = self._end if self._end is not None else len(body)
        fragment = body[self._sent:limit]
        self._sent = limit
        return fragment
