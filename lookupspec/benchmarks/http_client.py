"""Timed streaming requests to an OpenAI-compatible server, for the HTTP benchmarks.

``stream_chat`` sends one request with ``"stream": true`` and records, per SSE event that carries text,
its arrival time (``time.perf_counter`` when the network read that completed it returned) and its
text; plus the ``usage``, ``finish_reason`` and our server's ``speculation`` object when the server
sends them. It works with any server that streams
OpenAI's ``data: {json}`` events (lookupspec, ``transformers serve``, llama.cpp's ``llama-server``):
lines that are not ``data:`` (comments, ``event:``, blank) are skipped, ``data: [DONE]`` ends the
stream, and an ``{"error": ...}`` event (an object, as OpenAI and lookupspec send it, or a string,
as ``transformers serve`` does) ends it with that error.

Latency rules (shared by ``bench-gateway`` and ``bench-serve``):

- **TTFT**: request sent to the first event whose text is non-empty (queueing included).
- **Chunk gaps**: time between consecutive text events. A lookupspec step that emits several tokens
  arrives as one event, so this is the per-step latency.
- **Token gaps** (``token_gaps``): an arrival carrying k tokens contributes k gaps of gap / k, the rule
  the server's own ``lookupspec_inter_token_latency_seconds`` histogram follows. An arrival is one
  network read: every event in it gets the read's time (a server that writes several one-token
  events at once, as ``transformers serve`` does under load, delivers them as one arrival). The first
  arrival contributes no gap (its wait is the TTFT).
- **Percentiles**: nearest rank on the sorted values, index ``round(q / 100 * (n - 1))``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lookupspec.sse import DONE, StreamState, parse_sse_line

__all__ = ["StreamedResponse", "bearer", "percentile", "stream_chat", "token_gaps"]

def bearer(key: str | None) -> dict[str, str]:
    """The ``Authorization`` header for an API key; none without one."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values. Example: [4, 1, 3, 2] at 50 -> 3 (index 2 of 0..3)."""
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def token_gaps(times: Sequence[float], tokens: Sequence[int]) -> list[float]:
    """Per-token gaps of one response from its text events' arrival ``times`` and token counts.
    Events with the same time arrived in one network read and count as one arrival of their summed
    tokens. Example: times [0.0, 0.3, 0.4], tokens [1, 3, 1] -> [0.1, 0.1, 0.1, 0.1]; so do times
    [0.0, 0.3, 0.3, 0.4] with tokens [1, 1, 2, 1]."""
    if len(times) != len(tokens):
        raise ValueError(f"{len(times)} event times but {len(tokens)} token counts")
    arrivals: list[tuple[float, int]] = []  # (time, tokens)
    for t, k in zip(times, tokens, strict=True):
        if arrivals and t == arrivals[-1][0]:
            arrivals[-1] = (t, arrivals[-1][1] + max(1, k))
        else:
            arrivals.append((t, max(1, k)))
    gaps: list[float] = []
    for (t0, _), (t1, n) in itertools.pairwise(arrivals):
        gaps.extend([(t1 - t0) / n] * n)
    return gaps


@dataclass
class StreamedResponse:
    """What one streamed request produced. Times are ``time.perf_counter()`` values."""

    sent: float
    times: list[float] = field(default_factory=list)  # arrival of each event with text
    finished: float | None = None  # when the stream ended ([DONE], the connection closing, or an error)
    status: int = 0
    state: StreamState = field(default_factory=StreamState)
    http_error: str | None = None  # a response that was not 200

    @property
    def texts(self) -> list[str]:  # each text event's text
        return self.state.texts

    @property
    def text(self) -> str:
        return "".join(self.texts)

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.state.usage

    @property
    def speculation(self) -> dict[str, Any] | None:  # lookupspec's statistics
        return self.state.speculation

    @property
    def finish_reason(self) -> str | None:
        return self.state.finish_reason

    @property
    def error(self) -> str | None:
        if self.http_error is not None:
            return self.http_error
        return None if self.state.error is None else str(self.state.error.get("message"))

    @property
    def ttft(self) -> float | None:
        return self.times[0] - self.sent if self.times else None

    @property
    def chunk_gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]

    @property
    def completion_tokens(self) -> int | None:
        return None if self.usage is None else self.usage.get("completion_tokens")

    def feed(self, event: dict[str, Any], now: float) -> bool:
        """Record one data event; False when it is an error (the stream is over)."""
        if self.state.feed(event):
            self.times.append(now)
        return self.state.error is None


async def stream_chat(http: Any, body: dict[str, Any], path: str = "/v1/chat/completions",
                      headers: Mapping[str, str] | None = None) -> StreamedResponse:
    """POST ``body`` (``stream`` is set) on an ``httpx.AsyncClient`` and time its events; ``headers``
    are added to the client's. HTTP errors and error events are returned in ``error``, not raised;
    transport errors propagate."""
    body = {**body, "stream": True}
    out = StreamedResponse(sent=time.perf_counter())
    async with http.stream("POST", path, json=body, headers=dict(headers or {})) as r:
        out.status = r.status_code
        if r.status_code != 200:
            out.http_error = f"HTTP {r.status_code}: {(await r.aread())[:300].decode(errors='replace')}"
            out.finished = time.perf_counter()
            return out
        buffer = ""
        async for piece in r.aiter_text():
            now = time.perf_counter()  # every event of one network read gets its arrival time
            buffer += piece
            *lines, buffer = buffer.split("\n")
            if not _feed_lines(out, lines, now):
                break
        else:
            _feed_lines(out, [buffer], time.perf_counter())
    out.finished = time.perf_counter()
    return out


def _feed_lines(out: StreamedResponse, lines: Sequence[str], now: float) -> bool:
    """False once the stream is over ([DONE] or an error event)."""
    for line in lines:
        event = parse_sse_line(line.rstrip("\r"))
        if event is None:
            continue
        if event == DONE or (isinstance(event, dict) and not out.feed(event, now)):
            return False
    return True
