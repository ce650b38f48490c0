"""Turning a job's events into an HTTP response: one JSON body, or Server-Sent Events.

SSE, as OpenAI sends it: every event is ``data: {json}\\n\\n``; a chat stream's first chunk per choice
carries ``delta.role``; the chunk that ends a choice carries its ``finish_reason`` (and, as our
extension, that choice's ``speculation``); with ``stream_options.include_usage`` every chunk has
``"usage": null`` and a last chunk has ``"choices": []``, the ``usage`` and the request's
``speculation``; an error after the stream began is sent as ``data: {"error": {...}}``; the stream
always ends with ``data: [DONE]``.

Log-probabilities ride on the chunk of the text they produced (``logprobs.content`` for chat,
OpenAI's legacy ``tokens`` / ``token_logprobs`` / ``top_logprobs`` / ``text_offset`` for
completions). Tool calls (``job.tools``):

- a constrained call (``tool_choice`` ``required`` or named) streams as it is generated
  (:class:`lookupspec.service.tool_stream.CallStream`): one ``delta.tool_calls`` entry with ``index``,
  ``id``, ``type``, ``function.name`` and empty ``function.arguments``, then entries with the
  arguments' fragments, then ``finish_reason: "tool_calls"`` (``"length"`` for a call cut by
  ``max_tokens``, whose arguments are then unfinished). An output cut before its call's name was
  complete is sent as content, as the non-streamed response reads it.
- ``auto``: the output is held until its choice ends, since only the whole text says whether it
  holds calls; then one delta carries either the calls (the whole ``function.arguments``) and
  ``finish_reason: "tool_calls"``, or the text as content.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import Request

from lookupspec.service.accounting import speculation, usage
from lookupspec.service.jobs import AsyncTicket, ChoiceFinished, JobDone, JobFailed, TextDelta
from lookupspec.service.tool_stream import CallStream
from lookupspec.service.tools import parse_calls

__all__ = ["Collected", "Kind", "chat_logprobs", "collect", "completion_logprobs", "new_id", "sse_events",
           "tool_output"]

Kind = Literal["completion", "chat"]
_DONE = b"data: [DONE]\n\n"


def new_id(kind: Kind) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


@dataclass
class Collected:
    texts: dict[int, list[str]] = field(default_factory=dict)
    finished: dict[int, ChoiceFinished] = field(default_factory=dict)
    logprobs: dict[int, list[Any]] = field(default_factory=dict)  # per choice: TextDelta.logprobs entries


def chat_logprobs(entries: list[Any]) -> dict[str, Any]:
    """OpenAI's chat ``logprobs`` object from TextDelta entries (id, text, logprob, top)."""
    def one(text: str, lp: float) -> dict[str, Any]:
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**one(text, lp), "top_logprobs": [one(t, v) for _, t, v in top]}
                        for _, text, lp, top in entries]}


def completion_logprobs(entries: list[Any], offset: int = 0) -> dict[str, Any]:
    """OpenAI's legacy completions ``logprobs`` object (``offset``: characters already sent)."""
    offsets, pos = [], offset
    for _, text, _, _ in entries:
        offsets.append(pos)
        pos += len(text)
    return {"tokens": [text for _, text, _, _ in entries], "token_logprobs": [lp for _, _, lp, _ in entries],
            "top_logprobs": [{t: v for _, t, v in top} for _, _, _, top in entries],
            "text_offset": offsets}


def tool_output(text: str, plan: Any) -> tuple[str | None, list[dict[str, Any]] | None]:
    """(content, tool_calls) of a finished choice whose output is read as tool calls."""
    content, calls = parse_calls(text, plan)
    return content, calls or None


async def _watch_disconnect(request: Request, ticket: AsyncTicket) -> None:
    """Cancel the job when the client goes away (the body was read already, so the next ASGI
    message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            ticket.cancel("disconnect")
            return


async def collect(request: Request, ticket: AsyncTicket) -> Collected:
    """Run a non-streaming request to its end; raise its ``APIError`` if it failed."""
    watcher = asyncio.create_task(_watch_disconnect(request, ticket))
    out = Collected()
    try:
        async for event in ticket.events():
            if isinstance(event, TextDelta):
                out.texts.setdefault(event.index, []).append(event.text)
                if event.logprobs:
                    out.logprobs.setdefault(event.index, []).extend(event.logprobs)
            elif isinstance(event, ChoiceFinished):
                out.finished[event.index] = event
            elif isinstance(event, JobFailed):
                raise event.error
            elif isinstance(event, JobDone):
                break
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        ticket.cancel("disconnect")  # no-op once the job is done; stops it if this task was cancelled
    return out


def _data(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def sse_events(ticket: AsyncTicket, kind: Kind, model: str,
                     include_usage: bool) -> AsyncIterator[bytes]:
    """The SSE body of a streamed request (see the module docstring)."""
    rid, created = new_id(kind), int(time.time())
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    base: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model}
    if include_usage:
        base["usage"] = None

    def chunk(choice: dict[str, Any], **extra: Any) -> bytes:
        return _data({**base, "choices": [choice], **extra})

    sent: dict[int, int] = {}  # characters of text sent per choice (completions' text_offset)

    def choice(index: int, text: str | None, finish: str | None, role: bool = False,
               logprobs: Any = None, calls: list[dict[str, Any]] | None = None,
               call_deltas: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        lp = None
        if logprobs:
            lp = (chat_logprobs(list(logprobs)) if kind == "chat"
                  else completion_logprobs(list(logprobs), sent.get(index, 0)))
        sent[index] = sent.get(index, 0) + len(text or "")
        if kind == "completion":
            return {"index": index, "text": text or "", "logprobs": lp, "finish_reason": finish}
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        if calls:
            delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(calls)]
        if call_deltas:
            delta["tool_calls"] = call_deltas
        return {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}

    finished: list[ChoiceFinished] = []
    tools = ticket.job.tools
    held: dict[int, list[str]] = {}  # tool_choice auto: text held until the choice ends
    held_lp: dict[int, list[Any]] = {}  # tool calls: log-probabilities not sent yet
    streams: dict[int, CallStream] = {}  # constrained calls, streamed as they are generated
    constrained = tools is not None and tools.syntax == "json"
    try:
        if kind == "chat":
            for c in ticket.job.choices:
                yield chunk(choice(c.index, "", None, role=True))
        async for event in ticket.events():
            if isinstance(event, TextDelta):
                if tools is not None:
                    held_lp.setdefault(event.index, []).extend(event.logprobs or ())
                    if constrained:
                        deltas = streams.setdefault(event.index, CallStream()).feed(event.text)
                        if deltas:
                            lps = held_lp.pop(event.index, None)
                            yield chunk(choice(event.index, None, None, logprobs=lps, call_deltas=deltas))
                    else:
                        held.setdefault(event.index, []).append(event.text)
                    continue
                yield chunk(choice(event.index, event.text, None, logprobs=event.logprobs))
            elif isinstance(event, ChoiceFinished):
                finished.append(event)
                reason = event.finish_reason
                stream = streams.pop(event.index, None)
                if stream is not None and stream.started:
                    deltas, complete = stream.finish()
                    if complete:
                        reason = "tool_calls"
                    lps = held_lp.pop(event.index, None)
                    if deltas or lps:
                        yield chunk(choice(event.index, None, None, logprobs=lps, call_deltas=deltas))
                elif tools is not None:
                    text = stream.text if stream is not None else "".join(held.pop(event.index, []))
                    content, calls = tool_output(text, tools)
                    if calls:
                        reason = "tool_calls"
                    yield chunk(choice(event.index, content, None, logprobs=held_lp.pop(event.index, None),
                                       calls=calls))
                yield chunk(choice(event.index, None if kind == "chat" else "", reason),
                            speculation=speculation([event.stats]))
            elif isinstance(event, JobFailed):
                yield _data(event.error.body())
                break
            elif isinstance(event, JobDone):
                if include_usage:
                    yield _data({**base, "choices": [],
                                 "usage": usage(ticket.job.prompt_tokens, finished),
                                 "speculation": speculation([f.stats for f in finished])})
                break
        yield _DONE
    finally:
        # Runs when the stream ends and when the client disconnects (the response task is
        # cancelled): either way the job must stop generating for nobody.
        ticket.cancel("disconnect")
