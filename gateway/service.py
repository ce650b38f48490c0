"""The generation service: one worker thread runs the engine; requests wait in a bounded queue.

On a CPU one generation at a time is fastest (the model already uses every core), so the service has
exactly one worker thread. ``submit`` admits a job when fewer than ``max_queue`` jobs wait, else it
raises a 429 ``APIError`` with ``Retry-After`` (the expected wait). The event loop never runs model
work: the worker streams events back to it through the job's ``Ticket`` (``call_soon_threadsafe``).

Every job ends in one terminal event (``jobs``). Cancelling a ticket (client disconnect) stops the
generation at the next step; so does the job's deadline. Shutdown (``lifecycle``): ``begin_drain``
refuses new jobs; ``cut_off`` ends the waiting and running ones with a 503 ``shutting_down`` (the
worker keeps running, so every ticket gets its terminal event); ``close`` also stops the worker.
When a choice ends (finished, cancelled or failed), its output tokens are appended to the namespace's
output log through the store, on a separate writer thread so fsync or a Redis round trip never delays
the next request.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import threading
import time
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from lookupspec.params import GenerationParams, LookupScope, SpecParams
from lookupspec.stats import AggregateStats, RequestStats
from lookupspec.text import TextChunk

from .config import GatewayConfig
from .errors import APIError
from .indexes import IndexRegistry
from .jobs import ChoiceFinished, GenerationJob, JobDone, JobFailed, TextDelta, Ticket
from .metrics import GatewayMetrics
from .store import BufferFullError, Store, StoreError

__all__ = ["GatewayService"]

log = logging.getLogger(__name__)

_FAILURES_BEFORE_UNHEALTHY = 3  # consecutive engine errors after which /health reports 503


def _shutting_down() -> APIError:
    return APIError(503, "the server is shutting down", code="shutting_down", headers={"Retry-After": "1"})


def _cancelled(ticket: Ticket) -> APIError:
    """The error a cancelled job ends with: the server's shutdown, or the client gone."""
    if ticket.cancel_reason == "shutdown":
        return _shutting_down()
    return APIError(499, "the client went away", code="cancelled")


@dataclass
class _Queued:
    ticket: Ticket
    enqueued: float


class GatewayService:
    """Holds the text engine, the shared store and this replica's indexes; runs generations."""

    def __init__(self, text_engine: Any, store: Store, indexes: IndexRegistry, config: GatewayConfig,
                 metrics: GatewayMetrics | None = None) -> None:
        self.text_engine = text_engine
        self.engine = text_engine.engine
        self.store = store
        self.indexes = indexes
        self.config = config
        self.metrics = metrics or GatewayMetrics(self.snapshot)
        window = int(self.engine.context_window)
        self.context_window = min(window, config.max_model_len) if config.max_model_len else window
        self.aggregate = AggregateStats()
        self.started_at = time.time()
        self._cond = threading.Condition()
        self._queue: collections.deque[_Queued] = collections.deque()
        self._running: Ticket | None = None
        self._stopping = False
        self._draining = False
        self._worker: threading.Thread | None = None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="output-append")
        self._job_seconds = 1.0  # moving average of one job's run time, for Retry-After
        self._engine_failures = 0

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        with self._cond:
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="generation-worker", daemon=True)
                self._worker.start()

    @property
    def worker_alive(self) -> bool:
        return self._worker is not None and self._worker.is_alive()

    @property
    def draining(self) -> bool:
        return self._draining

    def begin_drain(self) -> None:
        """SIGTERM: refuse new requests; queued and running ones go on."""
        self._draining = True

    def cut_off(self) -> None:
        """The drain timeout passed: fail the jobs still waiting, and stop the running one at its next
        step, both with 503 ``shutting_down``. New jobs stay refused; the worker keeps running."""
        with self._cond:
            self._draining = True
            waiting = list(self._queue)
            self._queue.clear()
            running = self._running
        for q in waiting:
            self.metrics.aborted.labels(reason="shutdown").inc()
            q.ticket.emit(JobFailed(_shutting_down()))
        if running is not None:
            running.cancel("shutdown")

    def close(self, timeout: float = 10.0) -> None:
        """Cut off what waits or runs, stop the worker, flush output appends."""
        self.cut_off()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._worker is not None:
            self._worker.join(timeout)
        self._writer.shutdown(wait=True)

    # ---- admission --------------------------------------------------------------------------

    def submit(self, job: GenerationJob, loop: asyncio.AbstractEventLoop) -> Ticket:
        """Queue ``job``; raise 429 when the queue is full, 503 while draining or when the engine is
        unusable."""
        ticket = Ticket(job, loop, deadline_error=self.deadline_error, worker_alive=lambda: self.worker_alive)
        with self._cond:
            if self._draining:
                self.metrics.rejected.labels(reason="draining").inc()
                raise _shutting_down()
            if not self.worker_alive:
                self.metrics.rejected.labels(reason="engine_unavailable").inc()
                raise APIError(503, "the generation worker is not running", code="engine_unavailable")
            # Capacity is one running job plus max_queue waiting ones. Count a job the worker has
            # not picked up yet as the running one when the worker is idle: otherwise admission
            # would depend on how fast the worker thread wakes up (a race under load).
            waiting = len(self._queue) - (0 if self._running is not None else 1)
            if waiting >= self.config.max_queue:
                self.metrics.rejected.labels(reason="queue_full").inc()
                retry = max(1, math.ceil(self._job_seconds * (len(self._queue) + 1)))
                raise APIError(429, f"the server is busy ({len(self._queue)} requests waiting); "
                               f"retry after {retry} s", code="queue_full",
                               headers={"Retry-After": str(retry)})
            self._queue.append(_Queued(ticket, time.perf_counter()))
            self._cond.notify()
        return ticket

    def deadline_error(self) -> APIError:
        return APIError(504, f"the request did not finish within its deadline of "
                             f"{self.config.request_timeout_s:g} s", code="request_timeout")

    # ---- the worker -------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                item = self._queue.popleft()
                self._running = item.ticket
            started = time.perf_counter()
            try:
                self._run(item.ticket, started - item.enqueued)
            except Exception as exc:  # a bug here must fail the job, never kill the worker
                log.exception("generation job failed")
                item.ticket.emit(JobFailed(APIError(500, f"internal error: {type(exc).__name__}",
                                                    code="internal_error")))
            finally:
                with self._cond:
                    self._running = None
                self._job_seconds = 0.8 * self._job_seconds + 0.2 * (time.perf_counter() - started)

    def _generate(self, prompt_ids: tuple[int, ...], params: GenerationParams, stop: Sequence[str],
                  spec: SpecParams, scope: LookupScope) -> Generator[TextChunk, None, None]:
        """The one place the service calls the engine (through the text layer: detokenization and
        stop strings, as in-process callers get them)."""
        return self.text_engine.stream_ids(prompt_ids, params, stop, spec=spec, scope=scope)

    def _run(self, ticket: Ticket, queued_s: float) -> None:
        job = ticket.job
        self.metrics.queue_time.observe(queued_s)
        if ticket.cancelled.is_set():
            self.metrics.aborted.labels(reason=ticket.cancel_reason).inc()
            ticket.emit(JobFailed(_cancelled(ticket)))
            return
        if time.perf_counter() > job.deadline:
            self.metrics.aborted.labels(reason="deadline").inc()
            ticket.emit(JobFailed(self.deadline_error()))
            return
        last_token_at: float | None = None
        for choice in job.choices:
            tokens: list[int] = []
            stats: RequestStats | None = None
            reason: str | None = None
            failure: APIError | None = None
            gen = self._generate(choice.prompt_ids, choice.params, job.stop, job.spec, job.scope)
            try:
                for chunk in gen:
                    now = time.perf_counter()
                    stats = chunk.stats or stats
                    if chunk.token_ids:
                        if last_token_at is None:
                            self.metrics.ttft.observe(now - job.arrived)
                        else:
                            gap = (now - last_token_at) / len(chunk.token_ids)
                            for _ in chunk.token_ids:
                                self.metrics.itl.observe(gap)
                        last_token_at = now
                    tokens.extend(chunk.token_ids)
                    if chunk.text:
                        ticket.emit(TextDelta(choice.index, chunk.text))
                    if chunk.finish_reason is not None:
                        reason = chunk.finish_reason
                        break
                    if ticket.cancelled.is_set():
                        failure = _cancelled(ticket)
                        self.metrics.aborted.labels(reason=ticket.cancel_reason).inc()
                        break
                    if now > job.deadline:
                        failure = self.deadline_error()
                        self.metrics.aborted.labels(reason="deadline").inc()
                        break
                else:
                    reason = "length"  # an engine that ends without a finish_reason
            except Exception as exc:
                # The request was validated before it was queued, so this is the engine failing.
                log.exception("the engine failed")
                self._engine_failures += 1
                self.metrics.aborted.labels(reason="engine_error").inc()
                failure = APIError(500, f"the engine failed: {type(exc).__name__}: {exc}",
                                   code="engine_error")
            finally:
                gen.close()  # stops the decode loop (stop string, cancel, deadline)
            self._append_output(job.namespace, tokens)
            if failure is not None:
                ticket.emit(JobFailed(failure))
                return
            self._engine_failures = 0
            stats = stats or RequestStats()
            self.metrics.observe_stats(stats, len(choice.prompt_ids), len(tokens))
            self.aggregate.add(stats)
            assert reason is not None
            ticket.emit(ChoiceFinished(choice.index, reason, len(choice.prompt_ids), len(tokens), stats))
        self.metrics.e2e.observe(time.perf_counter() - job.arrived)
        ticket.emit(JobDone())

    # ---- output log -------------------------------------------------------------------------

    def _append_output(self, namespace: str, tokens: list[int]) -> None:
        if tokens:
            arr = np.asarray(tokens, dtype=np.int32)
            try:
                self._writer.submit(self._write_output, namespace, arr)
            except RuntimeError:  # the writer is shut down (closing): the output cache may drop it
                self.metrics.output_appends.labels(result="dropped").inc()

    def _write_output(self, namespace: str, tokens: np.ndarray) -> None:
        """tokens: [num_tokens] int32. Runs on the writer thread."""
        try:
            ack = self.store.append_output(namespace, tokens)
        except BufferFullError:
            self.metrics.output_appends.labels(result="dropped").inc()  # a cache: dropping is fine
            return
        except StoreError as exc:
            log.warning("output append failed: %s", exc)
            self.metrics.output_appends.labels(result="dropped").inc()
            return
        self.metrics.output_appends.labels(result="buffered" if ack.buffered else "ok").inc()

    def flush_outputs(self, timeout: float = 10.0) -> None:
        """Wait until every output queued so far was appended (tests, shutdown)."""
        self._writer.submit(lambda: None).result(timeout)

    # ---- state ------------------------------------------------------------------------------

    @property
    def engine_ok(self) -> bool:
        return self.worker_alive and self._engine_failures < _FAILURES_BEFORE_UNHEALTHY

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            waiting, running = len(self._queue), int(self._running is not None)
        return {
            "queue_depth": waiting,
            "running": running,
            "engine_ok": int(self.engine_ok),
            "draining": int(self._draining),
            "store": self.store.health(),
            "indexes": self.indexes.sizes(),
        }
