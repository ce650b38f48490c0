"""Turning a job's events into an HTTP response: one JSON body, or Server-Sent Events.

SSE, as OpenAI sends it: every event is ``data: {json}\\n\\n``; a chat stream's first chunk per choice
carries ``delta.role``; the chunk that ends a choice carries its ``finish_reason`` (and, as our
extension, that choice's ``speculation``); with ``stream_options.include_usage`` every chunk has
``"usage": null`` and a last chunk has ``"choices": []``, the ``usage`` and the request's
``speculation``; an error after the stream began is sent as ``data: {"error": {...}}``; the stream
always ends with ``data: [DONE]``.
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

__all__ = ["Collected", "Kind", "collect", "new_id", "sse_events"]

Kind = Literal["completion", "chat"]
_DONE = b"data: [DONE]\n\n"


def new_id(kind: Kind) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


@dataclass
class Collected:
    texts: dict[int, list[str]] = field(default_factory=dict)
    finished: dict[int, ChoiceFinished] = field(default_factory=dict)


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

    def choice(index: int, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if kind == "completion":
            return {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}

    finished: list[ChoiceFinished] = []
    try:
        if kind == "chat":
            for c in ticket.job.choices:
                yield chunk(choice(c.index, "", None, role=True))
        async for event in ticket.events():
            if isinstance(event, TextDelta):
                yield chunk(choice(event.index, event.text, None))
            elif isinstance(event, ChoiceFinished):
                finished.append(event)
                yield chunk(choice(event.index, None if kind == "chat" else "", event.finish_reason),
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
