"""A generation job, the events its worker emits, and the ``Ticket`` through which its caller
receives them.

The worker thread calls ``Ticket.emit``; the caller iterates ``events``: an ``AsyncTicket`` delivers
onto the request's event loop (``call_soon_threadsafe``; the gateway), a ``SyncTicket`` into a
thread-safe queue (the in-process client). A job ends in exactly one terminal event, ``JobDone`` or
``JobFailed``; ``events`` also ends on its own when the job's deadline passes (plus a grace second
for the worker to notice first) or the worker is gone, so a caller is never left hanging.
``Ticket.cancel`` (client disconnect, deadline, shutdown) is read by the worker between steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from lookupspec.params import GenerationParams, LookupScope, SpecParams
from lookupspec.stats import RequestStats

from .errors import ServiceError

__all__ = [
    "AsyncTicket",
    "ChoiceFinished",
    "ChoicePlan",
    "Event",
    "GenerationJob",
    "JobDone",
    "JobFailed",
    "SyncTicket",
    "TextDelta",
    "Ticket",
]


@dataclass(frozen=True)
class ChoicePlan:
    """One generation: choice ``index`` of the response."""

    index: int
    prompt_ids: tuple[int, ...]  # [prompt_len], validated against the vocabulary and the window
    params: GenerationParams


@dataclass(frozen=True)
class GenerationJob:
    """Everything the worker needs; built (and validated) by ``planning`` before it is queued."""

    namespace: str
    choices: tuple[ChoicePlan, ...]
    prompt_tokens: int  # usage: each distinct prompt counted once (not once per sample)
    stop: tuple[str, ...]
    spec: SpecParams
    scope: LookupScope
    arrived: float  # time.perf_counter() when the request arrived
    deadline: float  # time.perf_counter() after which the job is abandoned
    tools: Any = None  # lookupspec.service.tools.ToolPlan: the output is read as tool calls


@dataclass(frozen=True)
class TextDelta:
    index: int
    text: str
    # [(token id, token text, logprob, [(alternative id, its text, logprob), ...])] of the tokens this
    # delta's step emitted, when the request asked for log-probabilities
    logprobs: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class ChoiceFinished:
    index: int
    finish_reason: str  # "stop" | "length" | "tool_calls" (set by the front end from the output)
    prompt_tokens: int
    completion_tokens: int
    stats: RequestStats


@dataclass(frozen=True)
class JobDone:
    pass


@dataclass(frozen=True)
class JobFailed:
    error: ServiceError


Event = TextDelta | ChoiceFinished | JobDone | JobFailed


class Ticket:
    """The caller's side of one job; subclasses say how events reach the caller."""

    def __init__(self, job: GenerationJob, *, deadline_error: Callable[[], ServiceError],
                 worker_alive: Callable[[], bool]) -> None:
        self.job = job
        self._deadline_error = deadline_error
        self._worker_alive = worker_alive
        self.cancelled = threading.Event()
        self.cancel_reason = "disconnect"
        self._on_cancel: list[Callable[[str], object]] = []

    def emit(self, event: Event) -> None:
        """Called from the worker thread."""
        raise NotImplementedError

    def cancel(self, reason: str = "disconnect") -> None:
        if not self.cancelled.is_set():
            self.cancel_reason = reason
            self.cancelled.set()
            for hook in self._on_cancel:
                hook(reason)

    def on_cancel(self, hook: Callable[[str], object]) -> None:
        """Call ``hook(reason)`` when the ticket is cancelled (at once if it already was)."""
        self._on_cancel.append(hook)
        if self.cancelled.is_set():
            hook(self.cancel_reason)

    def _wait_s(self) -> float:
        return max(0.0, min(5.0, self.job.deadline + 1.0 - time.perf_counter()))

    def _abandoned(self) -> JobFailed | None:
        """After a wait without events: the terminal event the worker will not send, if any."""
        if time.perf_counter() > self.job.deadline + 1.0:
            self.cancel("deadline")
            return JobFailed(self._deadline_error())
        if not self._worker_alive():
            self.cancel("shutdown")
            return JobFailed(ServiceError(503, "the generation worker stopped", code="engine_unavailable"))
        return None


class AsyncTicket(Ticket):
    """Events delivered onto an asyncio event loop (the gateway's requests)."""

    def __init__(self, job: GenerationJob, loop: asyncio.AbstractEventLoop, **kwargs: Callable) -> None:
        super().__init__(job, **kwargs)
        self._loop = loop
        self._queue: asyncio.Queue[Event] = asyncio.Queue()

    def emit(self, event: Event) -> None:
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening any more
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    async def events(self) -> AsyncIterator[Event]:
        """Events until the terminal one (see the module docstring)."""
        while True:
            if not self._queue.empty():  # fast path: no timer while tokens are flowing
                event = self._queue.get_nowait()
            else:
                try:
                    async with asyncio.timeout(self._wait_s()):
                        event = await self._queue.get()
                except TimeoutError:
                    failed = self._abandoned()
                    if failed is not None:
                        yield failed
                        return
                    continue
            yield event
            if isinstance(event, JobDone | JobFailed):
                return


class SyncTicket(Ticket):
    """Events delivered into a thread-safe queue (the in-process client's calling thread)."""

    def __init__(self, job: GenerationJob, **kwargs: Callable) -> None:
        super().__init__(job, **kwargs)
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()

    def emit(self, event: Event) -> None:
        self._queue.put(event)

    def events(self) -> Iterator[Event]:
        """Events until the terminal one (see the module docstring)."""
        while True:
            try:
                event = self._queue.get(timeout=self._wait_s())
            except queue.Empty:
                failed = self._abandoned()
                if failed is not None:
                    yield failed
                    return
                continue
            yield event
            if isinstance(event, JobDone | JobFailed):
                return
