"""The generation service: the engine runs in one scheduler loop that serves every request together.

``submit`` turns a validated job into scheduler requests (one per distinct prompt; its ``n`` choices
fork one prefill) and returns the job's ``Ticket``. The scheduler (:mod:`lookupspec.scheduler`) batches
every running sequence into one target forward per step, prefills long prompts in chunks between
steps, and hands each choice's steps to a :class:`_ChoiceSink` on its thread: the sink detokenizes
(stop strings included), observes latencies, and emits events to the request's event loop
(``call_soon_threadsafe``). The event loop never runs model work.

Admission counts the requests waiting beyond the slots: a job is refused with 429 and ``Retry-After``
when ``max_queue`` requests already wait for a slot (``max_batch`` sequences run at once).

Every job ends in one terminal event (``jobs``). Cancelling a ticket (client disconnect) cancels its
scheduler requests, which end at the next iteration with their slots freed; a deadline does the same
for its own request only; a request that fails ends alone and the batch goes on. Shutdown
(``lifecycle``): ``begin_drain`` refuses new jobs; ``cut_off`` ends the waiting and running ones with a
503 ``shutting_down`` (the loop keeps running, so every ticket gets its terminal event); ``close`` also
stops the loop. When a choice ends (finished, cancelled or failed), its output tokens are appended to
the namespace's output log through the store, on a separate writer thread so fsync or a Redis round
trip never delays the next step.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, overload

import numpy as np

from lookupspec.iteration_trace import IterationTrace
from lookupspec.scheduler import Cancelled, DeadlineExceeded, Request, Scheduler
from lookupspec.sequence import StepOutput
from lookupspec.stats import AggregateStats, RequestStats
from lookupspec.store import BufferFullError, Store, StoreError

from .config import ServiceConfig
from .errors import ServiceError
from .indexes import IndexRegistry
from .jobs import (
    AsyncTicket,
    ChoiceFinished,
    ChoicePlan,
    GenerationJob,
    JobDone,
    JobFailed,
    SyncTicket,
    TextDelta,
    Ticket,
)
from .metrics import ServiceMetrics

__all__ = ["Service", "build_service"]

log = logging.getLogger(__name__)

_FAILURES_BEFORE_UNHEALTHY = 3  # consecutive engine errors after which /health reports 503


def _shutting_down() -> ServiceError:
    return ServiceError(503, "the server is shutting down", code="shutting_down",
                        headers={"Retry-After": "1"})


def _cancelled(ticket: Ticket) -> ServiceError:
    """The error a cancelled job ends with: the server's shutdown, or the client gone."""
    if ticket.cancel_reason == "shutdown":
        return _shutting_down()
    return ServiceError(499, "the client went away", code="cancelled")


class _Job:
    """A job's progress across its choices (touched on the scheduler's thread only)."""

    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket
        self.open = len(ticket.job.choices)
        self.requests: list[Request] = []
        self.failed = False
        self.first_token_at: float | None = None


class _ChoiceSink:
    """One choice's steps, on the scheduler's thread: text, latencies, events, the output log."""

    def __init__(self, service: Service, job: _Job, choice: ChoicePlan) -> None:
        self.service = service
        self.job = job
        self.choice = choice
        self.follow = service.text_engine.follower(job.ticket.job.stop)
        self.tokens: list[int] = []
        self.last_token_at: float | None = None

    def deliver(self, out: StepOutput) -> bool:
        service, job = self.service, self.job
        if out.finish_reason == "error":  # a grammar dead end: this request ends, with what it says
            self.tokens.extend(out.tokens)
            self.fail(ServiceError(400, out.error or "generation failed", param="response_format",
                                   code="grammar_dead_end"))
            return False
        chunk = self.follow.feed(out)
        now = time.perf_counter()
        if chunk.token_ids:
            if job.first_token_at is None:
                job.first_token_at = now
                service.metrics.ttft.observe(now - job.ticket.job.arrived)
                admitted = job.requests[0].admitted if job.requests else None
                if admitted is not None:
                    service.metrics.queue_time.observe(max(0.0, admitted - job.requests[0].submitted))
            if self.last_token_at is not None:
                gap = (now - self.last_token_at) / len(chunk.token_ids)
                for _ in chunk.token_ids:
                    service.metrics.itl.observe(gap)
            self.last_token_at = now
        self.tokens.extend(chunk.token_ids)
        logprobs = None if out.logprobs is None else self._logprobs(out.logprobs)
        if (chunk.text or logprobs) and not job.failed:
            job.ticket.emit(TextDelta(self.choice.index, chunk.text, logprobs))
        if chunk.finish_reason is None:
            return True
        self._finished(chunk.finish_reason, chunk.stats or RequestStats())
        return False  # a stop string ends the sequence here; a finished one is already released

    def _logprobs(self, lps: Sequence[Any]) -> tuple[Any, ...]:
        """(id, text, logprob, [(id, text, logprob), ...]) per token (``lookupspec.logits.TokenLogprob``)."""
        decode = self.service.text_engine.tokenizer.decode
        return tuple((lp.token, decode([lp.token]), lp.logprob, [(t, decode([t]), v) for t, v in lp.top])
                     for lp in lps)

    def _finished(self, reason: str, stats: RequestStats) -> None:
        service, job = self.service, self.job
        service._append_output(job.ticket.job.namespace, self.tokens)
        service._engine_failures = 0
        service.metrics.observe_stats(stats, len(self.choice.prompt_ids), len(self.tokens))
        service.aggregate.add(stats)
        if job.failed:
            return
        prompt_len = len(self.choice.prompt_ids)
        job.ticket.emit(ChoiceFinished(self.choice.index, reason, prompt_len, len(self.tokens), stats))
        job.open -= 1
        if job.open == 0:
            seconds = time.perf_counter() - job.ticket.job.arrived
            service.metrics.e2e.observe(seconds)
            service._job_seconds = 0.8 * service._job_seconds + 0.2 * seconds
            job.ticket.emit(JobDone())

    def fail(self, error: BaseException) -> None:
        service, job = self.service, self.job
        service._append_output(job.ticket.job.namespace, self.tokens)
        if job.failed:
            return
        job.failed = True
        api_error = service._error_of(error, job.ticket)
        job.ticket.emit(JobFailed(api_error))
        for req in job.requests:  # the job is over: its other choices stop too
            req.cancel("failed")


class Service:
    """Holds the text engine, the shared store and this replica's indexes; runs generations."""

    def __init__(self, text_engine: Any, store: Store, indexes: IndexRegistry, config: ServiceConfig,
                 metrics: ServiceMetrics | None = None) -> None:
        self.text_engine = text_engine
        self.engine = text_engine.engine
        self.store = store
        self.indexes = indexes
        self.config = config
        self.metrics = metrics or ServiceMetrics(self.snapshot)
        window = int(self.engine.context_window)
        self.context_window = min(window, config.max_model_len) if config.max_model_len else window
        pool = self.engine.runner.pool  # with --kv-cache-mb, a prompt must fit one slot's share
        self.kv_slot_positions: int | None = None if pool.max_bytes is None else int(pool.slot_positions)
        self.aggregate = AggregateStats()
        self.started_at = time.time()
        self.trace = IterationTrace(config.trace_iterations) if config.trace_iterations else None
        self.scheduler = Scheduler(self.engine, max_batch=config.max_batch,
                                   max_batch_tokens=config.max_batch_tokens,
                                   prefill_stretch=config.prefill_stretch, trace=self.trace)
        self._lock = threading.Lock()
        self._draining = False
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="output-append")
        self._job_seconds = 1.0  # moving average of one job's run time, for Retry-After
        self._engine_failures = 0

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.scheduler.start()

    @property
    def worker_alive(self) -> bool:
        return self.scheduler.alive

    @property
    def draining(self) -> bool:
        return self._draining

    def begin_drain(self) -> None:
        """SIGTERM: refuse new requests; queued and running ones go on."""
        self._draining = True

    def cut_off(self) -> None:
        """The drain timeout passed: end the jobs still waiting or running with 503
        ``shutting_down`` at the scheduler's next iteration. New jobs stay refused; the loop keeps
        running, so every ticket gets its terminal event."""
        self._draining = True
        self.metrics.aborted.labels(reason="shutdown").inc(self.scheduler.waiting + self.scheduler.running)
        self.scheduler.cancel_all("shutdown")

    def close(self, timeout: float = 10.0) -> None:
        """Cut off what waits or runs, stop the loop, flush output appends."""
        self.cut_off()
        deadline = time.perf_counter() + min(timeout, 2.0)
        while (self.scheduler.waiting or self.scheduler.running) and time.perf_counter() < deadline:
            time.sleep(0.01)  # let the loop end them with their 503 before it stops
        self.scheduler.stop(timeout)
        self._writer.shutdown(wait=True)
        if self.trace is not None:
            self.trace.close()

    # ---- admission --------------------------------------------------------------------------

    @overload
    def submit(self, job: GenerationJob, loop: asyncio.AbstractEventLoop) -> AsyncTicket: ...

    @overload
    def submit(self, job: GenerationJob, loop: None = None) -> SyncTicket: ...

    def submit(self, job: GenerationJob, loop: asyncio.AbstractEventLoop | None = None) -> Ticket:
        """Queue ``job``; raise 429 when too many requests wait for a slot, 503 while draining or when
        the engine is unusable. Its events reach ``loop`` (an ``AsyncTicket``), or without a loop the
        calling thread (a ``SyncTicket``)."""
        hooks: dict[str, Callable] = {"deadline_error": self.deadline_error,
                                      "worker_alive": lambda: self.worker_alive}
        ticket = AsyncTicket(job, loop, **hooks) if loop is not None else SyncTicket(job, **hooks)
        prompts: dict[tuple[int, ...], list[ChoicePlan]] = {}
        for choice in job.choices:
            prompts.setdefault(choice.prompt_ids, []).append(choice)
        with self._lock:
            if self._draining:
                self.metrics.rejected.labels(reason="draining").inc()
                raise _shutting_down()
            if not self.worker_alive:
                self.metrics.rejected.labels(reason="engine_unavailable").inc()
                raise ServiceError(503, "the generation worker is not running", code="engine_unavailable")
            sched = self.scheduler
            free = max(0, sched.max_batch - sched.running)
            beyond = max(0, sched.waiting + len(prompts) - free)  # requests that would wait for a slot
            if beyond > self.config.max_queue:
                self.metrics.rejected.labels(reason="queue_full").inc()
                retry = max(1, math.ceil(self._job_seconds * beyond / sched.max_batch))
                raise ServiceError(429, f"the server is busy ({sched.waiting} requests waiting for a slot); "
                               f"retry after {retry} s", code="queue_full",
                               headers={"Retry-After": str(retry)})
            state = _Job(ticket)
            for ids, choices in prompts.items():
                sinks = [(c.params, _ChoiceSink(self, state, c)) for c in choices]
                state.requests.append(sched.submit(ids, sinks, job.spec, job.scope, deadline=job.deadline,
                                                   namespace=job.namespace))
        def cancel(reason: str) -> None:
            for req in state.requests:
                req.cancel(reason)

        ticket.on_cancel(cancel)
        return ticket

    def deadline_error(self) -> ServiceError:
        return ServiceError(504, f"the request did not finish within its deadline of "
                             f"{self.config.request_timeout_s:g} s", code="request_timeout")

    def _error_of(self, error: BaseException, ticket: Ticket) -> ServiceError:
        """The API error a choice that did not finish ends its job with."""
        if isinstance(error, ServiceError):  # the request's own fault (a grammar dead end)
            return error
        if isinstance(error, Cancelled):
            reason = "shutdown" if error.reason == "shutdown" else ticket.cancel_reason
            self.metrics.aborted.labels(reason=reason).inc()
            return _shutting_down() if reason == "shutdown" else _cancelled(ticket)
        if isinstance(error, DeadlineExceeded):
            self.metrics.aborted.labels(reason="deadline").inc()
            return self.deadline_error()
        log.error("the engine failed: %s: %s", type(error).__name__, error)
        self._engine_failures += 1
        self.metrics.aborted.labels(reason="engine_error").inc()
        return ServiceError(500, f"the engine failed: {type(error).__name__}: {error}", code="engine_error")

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
        sched = self.scheduler
        return {
            "queue_depth": sched.waiting,
            "running": sched.running,
            "engine_ok": int(self.engine_ok),
            "draining": int(self._draining),
            "store": self.store.health(),
            "indexes": self.indexes.sizes(),
            "scheduler": sched.stats,
            "prefix_cache": None if self.engine.prefix_cache is None else self.engine.prefix_cache.stats,
            "kv_cache": self._kv_cache(),
        }

    def _kv_cache(self) -> dict[str, float]:
        """The KV pool's size and growth, read without the scheduler's lock: a scrape may lag a step."""
        pool = self.engine.runner.pool
        return {"bytes": pool.nbytes, "resizes": pool.resizes, "resize_s": pool.resize_s}


def build_service(text_engine: Any, store: Store, config: ServiceConfig) -> Service:
    """A service over ``store``, whose indexes follow the store from now on. ``store`` may be started
    already (its state is replayed into the indexes) or not (then start it after this)."""
    indexes = IndexRegistry(output_cap_tokens=config.output_cap_tokens)
    store.subscribe(indexes, replay_existing=True)
    return Service(text_engine, store, indexes, config)
