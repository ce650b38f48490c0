"""The serving loop: one thread owns the engine; it admits, prefills in chunks, steps and retires.

Every front end that generates (the gateway, the in-process client, the batch job) submits requests
here; the loop runs them together. Each iteration:

1. takes new submissions and drops the cancelled ones and those past their deadline (their slots are
   freed within the iteration);
2. admits waiting requests, oldest first, while slots allow (``max_batch`` sequences; a request with
   ``n`` choices needs ``n``) and the KV pool can hold them;
3. chooses this iteration's prompt tokens, oldest request first: ``engine.prefill_chunk`` of them,
   or, while sequences decode and the forward is chunk-invariant (``engine.free_chunks``), as many
   as keep the forward within ``prefill_stretch`` times the plain step of every sequence holding a
   slot (:mod:`lookupspec.cost.chunk`: shorter gaps for the running streams, a slower prefill; up
   to two chunks' worth when the prefill falls behind the decode, or with nothing decoding). A
   chunk-invariant forward gives the same tokens in any chunking, so a request's chunks end where the
   budget does and the next prompt's chunk fills the rest; otherwise chunks stay whole at fixed
   offsets (several short prompts' last chunks can share an iteration), so a request's tokens do not
   depend on the load;
4. runs one engine forward (:meth:`Engine.iterate`) for those chunks and one decode/verify step of
   every running sequence, its rows capped by ``max_batch_tokens`` minus the chunks (the drafting
   policy chooses the draft budget across the batch). Running streams keep stepping while a long
   prompt is prefilled, and their rows ride on the chunk's forward instead of paying a forward of
   their own. Each sequence's output goes to its sink; when a prompt is done, its first token goes
   out and its other choices fork from its cache (one prefill for ``n`` choices).

A sink (:class:`Sink`) receives a sequence's outputs on the loop thread and must be quick (the
gateway's detokenizes and hands text to the event loop). Returning False from ``deliver`` stops
that sequence (a stop string). A request that fails, a step that raises included, ends alone with its
error; the batch goes on.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from lookupspec.cost import ChunkBudget
from lookupspec.engine import Engine
from lookupspec.iteration_trace import IterationTrace
from lookupspec.params import GenerationParams, LookupScope, SpecParams
from lookupspec.runtime import PoolFull
from lookupspec.sequence import SequenceState, StepOutput

__all__ = ["Cancelled", "DeadlineExceeded", "QueueFull", "Request", "Scheduler", "SchedulerStats", "Sink"]

log = logging.getLogger(__name__)


class Cancelled(Exception):
    """A request stopped before it finished (``reason``: "cancelled", "shutdown")."""

    def __init__(self, reason: str = "cancelled") -> None:
        super().__init__(reason)
        self.reason = reason


class DeadlineExceeded(Exception):
    """A request passed its deadline."""


class QueueFull(Exception):
    """More requests wait than the scheduler accepts (``max_waiting``)."""


class Sink(Protocol):
    """Where one choice's outputs go (called on the scheduler's thread)."""

    def deliver(self, output: StepOutput) -> bool:
        """One step's output; False stops the sequence (it is then finished for the scheduler)."""
        ...

    def fail(self, error: BaseException) -> None:
        """The choice ended without finishing: cancelled, past its deadline, or an error."""
        ...


@dataclass(eq=False)
class Request:
    """One prompt and its choices (``params[j]`` and ``sinks[j]`` per choice)."""

    prompt: tuple[int, ...]
    params: tuple[GenerationParams, ...]
    sinks: tuple[Sink, ...]
    spec: SpecParams | None
    scope: LookupScope | None
    deadline: float | None  # time.perf_counter() after which it is abandoned
    namespace: str | None = None  # prefix cache namespace
    submitted: float = field(default_factory=time.perf_counter)
    seqs: list[SequenceState] = field(default_factory=list)  # seqs[j]: choice j, once started
    open: list[bool] = field(default_factory=list)  # choice j still wants outputs
    cancel_reason: str | None = None
    admitted: float | None = None

    @property
    def n(self) -> int:
        return len(self.params)

    def cancel(self, reason: str = "cancelled") -> None:
        """Thread-safe: the loop drops the request at its next iteration."""
        if self.cancel_reason is None:
            self.cancel_reason = reason


@dataclass
class SchedulerStats:
    """What the loop has done (read by ``/metrics``; plain counters, updated on the loop thread)."""

    steps: int = 0
    step_rows: int = 0  # rows over all steps
    step_seqs: int = 0  # sequences over all steps
    decode_s: float = 0.0  # time in engine steps (of a forward shared with prompt chunks: the step's
    # estimated cost alone, from the step-cost model; the rest of the forward counts as prefill)
    decode_tokens: int = 0  # tokens emitted by engine steps
    prefill_s: float = 0.0
    prefill_tokens: int = 0
    prefill_chunks: int = 0
    shared_forwards: int = 0  # forwards that ran prompt chunks and a decode step together
    prefill_budget: int = 0  # prompt tokens the last forward with chunks could carry
    admitted: int = 0
    finished: int = 0
    failed: int = 0
    # per batch size: [steps, sequences, draft nodes] (draft nodes per sequence against batch size)
    by_batch: dict[int, list[int]] = field(default_factory=dict)

    def observe_step(self, batch: int, rows: int, nodes: int, seconds: float, tokens: int) -> None:
        self.steps += 1
        self.step_rows += rows
        self.step_seqs += batch
        self.decode_s += seconds
        self.decode_tokens += tokens
        entry = self.by_batch.setdefault(batch, [0, 0, 0])
        entry[0] += 1
        entry[1] += batch
        entry[2] += nodes


class Scheduler:
    """Runs ``engine`` for every submitted request (see the module docstring).

    ``max_batch``: sequences in flight at once (a request's choices count one each).
    ``max_batch_tokens``: rows a step may have, prefill chunk included (None: no cap beyond the
    drafting policy's own choice). ``max_waiting``: requests that may wait for a slot (None: no limit);
    :meth:`submit` raises :class:`QueueFull` past it. ``prefill_stretch``: while sequences decode, a
    forward carrying prompt chunks may take about this many times a plain step of the batch (see
    :mod:`lookupspec.cost.chunk`; 0: whole ``prefill_chunk`` chunks always). ``trace``: where to
    write one record per iteration that ran a forward (:mod:`lookupspec.iteration_trace`; the caller
    closes it)."""

    def __init__(self, engine: Engine, *, max_batch: int = 16, max_batch_tokens: int | None = None,
                 max_waiting: int | None = None, prefill_stretch: float = 2.5,
                 trace: IterationTrace | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        chunk = engine.prefill_chunk
        if max_batch_tokens is not None and max_batch_tokens < max_batch + (chunk or 0):
            raise ValueError(f"max_batch_tokens ({max_batch_tokens}) must hold one row per sequence "
                             f"({max_batch}) plus a prefill chunk ({chunk or 0})")
        self.engine = engine
        self.max_batch = max_batch
        self.max_batch_tokens = max_batch_tokens
        self.max_waiting = max_waiting
        self.budget = None
        if chunk is not None:
            self.budget = ChunkBudget(chunk, prefill_stretch, ceiling=self._ceiling(chunk))
        self.stats = SchedulerStats()
        self.trace = trace
        self._traced: dict[str, Any] | None = None  # the last forward's record, for the trace
        self._cond = threading.Condition()
        self._inbox: collections.deque[Request] = collections.deque()
        self._waiting: collections.deque[Request] = collections.deque()
        self._prefilling: collections.deque[Request] = collections.deque()
        self._running: list[tuple[Request, int]] = []  # (request, choice)
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.error: BaseException | None = None  # what killed the loop thread, if anything

    def _ceiling(self, chunk: int) -> int:
        """The most prompt tokens a forward may carry where chunks are free: two blocks (when the
        prefill must catch up with the decode, or nothing decodes), leaving a row for every slot
        within ``max_batch_tokens``."""
        ceiling = self.engine.chunk_ceiling
        assert ceiling is not None  # chunk is the engine's prefill_chunk, so it has a ceiling
        if self.max_batch_tokens is not None:
            ceiling = min(ceiling, self.max_batch_tokens - self.max_batch)
        return max(chunk, ceiling)

    # ---- submission (any thread) ------------------------------------------------------------------

    def submit(self, prompt: Sequence[int], choices: Sequence[tuple[GenerationParams, Sink]],
               spec: SpecParams | None = None, scope: LookupScope | None = None,
               deadline: float | None = None, namespace: str | None = None) -> Request:
        """Queue a prompt with one or more choices; returns the request (``cancel()`` it to stop).
        ``namespace``: the prefix cache's namespace for this prompt (None: not cached). Raises
        ValueError for a bad prompt, :class:`QueueFull` when too many wait."""
        if not choices:
            raise ValueError("a request needs at least one choice")
        if len(choices) > self.max_batch:
            raise ValueError(f"{len(choices)} choices exceed max_batch={self.max_batch}")
        ids = self.engine.check_prompt(prompt)
        req = Request(ids, tuple(p for p, _ in choices), tuple(s for _, s in choices), spec, scope, deadline,
                      namespace)
        req.open = [True] * req.n
        with self._cond:
            if self._stopping:
                raise Cancelled("shutdown")
            if self.max_waiting is not None and self.waiting >= self.max_waiting:
                raise QueueFull(f"{self.waiting} requests are waiting")
            self._inbox.append(req)
            self._cond.notify()
        return req

    @property
    def waiting(self) -> int:
        """Requests submitted and not admitted yet."""
        return len(self._inbox) + len(self._waiting)

    @property
    def running(self) -> int:
        """Sequences holding a slot (prefilling or decoding)."""
        return len(self._running) + sum(r.n for r in list(self._prefilling))  # a copy: other threads read it

    # ---- the loop ---------------------------------------------------------------------------------

    def start(self) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="lookupspec-scheduler", daemon=True)
                self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """End every request with ``Cancelled("shutdown")`` and stop the loop thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self._shutdown()

    def cancel_all(self, reason: str = "shutdown") -> None:
        """Cancel every request submitted so far (they end at the next iteration)."""
        with self._cond:
            for req in [*self._inbox, *self._waiting, *self._prefilling, *(r for r, _ in self._running)]:
                req.cancel(reason)
            self._cond.notify_all()

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._stopping:
                        break
                    if not (self._inbox or self._waiting or self._prefilling or self._running):
                        self._cond.wait(0.5)
                        continue
                if not self.run_once():
                    with self._cond:
                        self._cond.wait(0.01)  # waiting for a slot or a deadline
        except BaseException as exc:  # a bug here must not leave requests hanging
            log.exception("the scheduler loop failed")
            self.error = exc
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        with self._cond:
            reqs = [*self._inbox, *self._waiting, *self._prefilling, *(r for r, _ in self._running)]
            self._inbox.clear()
            self._waiting.clear()
            self._prefilling.clear()
            self._running.clear()
        error = Cancelled("shutdown") if self.error is None else self.error
        for req in dict.fromkeys(reqs):
            self._end(req, error)

    def run_once(self) -> bool:
        """One iteration (the loop thread's, or a test's). Returns whether anything ran."""
        with self._cond:
            self._waiting.extend(self._inbox)
            self._inbox.clear()
        now = time.perf_counter()
        self._drop_cancelled(now)
        admitted = self._admit()
        self._traced = None
        ran = self._iterate()
        if self.trace is not None and self._traced is not None:
            self.trace.record(iteration_s=time.perf_counter() - now, **self._traced)
        return admitted or ran

    # ---- parts of an iteration --------------------------------------------------------------------

    def _drop_cancelled(self, now: float) -> None:
        def gone(req: Request) -> BaseException | None:
            if req.cancel_reason is not None:
                return Cancelled(req.cancel_reason)
            if req.deadline is not None and now > req.deadline:
                return DeadlineExceeded()
            return None

        for queue in (self._waiting, self._prefilling):
            for req in list(queue):
                error = gone(req)
                if error is not None:
                    queue.remove(req)
                    self._end(req, error)
        for req in dict.fromkeys(r for r, _ in self._running):
            error = gone(req)
            if error is not None:
                self._end(req, error)

    def _admit(self) -> bool:
        admitted = False
        while self._waiting and self.running + self._waiting[0].n <= self.max_batch:
            req = self._waiting[0]
            try:
                seq = self.engine.start(req.prompt, req.params[0], req.spec, req.scope, req.namespace)
                req.seqs.append(seq)
            except PoolFull:
                if self.running == 0:  # nothing will free a slot: this request can never run
                    self._waiting.popleft()
                    self._end(req, PoolFull("the KV pool cannot hold this prompt"))
                    continue
                break
            except Exception as exc:  # a request that fails ends alone
                self._waiting.popleft()
                self._end(req, exc)
                continue
            # into _prefilling before out of _waiting: the gateway reads these counts without the
            # loop's lock, and a request counted nowhere for an instant would let one more in
            self._prefilling.append(req)
            self._waiting.popleft()
            req.admitted = time.perf_counter()
            self.stats.admitted += 1
            admitted = True
        return admitted

    def _chunks(self, live: list[tuple[Request, int]]) -> list[tuple[Request, int]]:
        """This iteration's prompt chunks, oldest request first (at least one chunk): ``(request,
        tokens)``. Where chunks are free (module docstring), up to the budget's tokens in all, each
        request's chunk ending where the budget or its prompt does. Elsewhere up to ``prefill_chunk``
        tokens, each request's chunks at their fixed offsets: a short prompt's last chunk leaves room
        for the next request's chunk in the same iteration."""
        chunk = self.engine.prefill_chunk
        out: list[tuple[Request, int]] = []
        done = 0
        if self.budget is not None and self._prefilling and self.engine.free_chunks:
            slots = len(live) + sum(r.n for r in self._prefilling)
            if live:
                per_token = self.engine.costs.steps.chunk_row_s  # measured by the engine
                drafting = sum(r.seqs[j].max_draft > 0 for r, j in live)
                drafting += sum(r.n for r in self._prefilling if r.seqs[0].max_draft > 0)
                budget = self.budget.tokens(self._plain_step(live), slots, per_token, drafting)
            else:
                budget = self.budget.idle()
            self.stats.prefill_budget = budget
            for req in self._prefilling:
                seq = req.seqs[0]
                size = min(len(seq.prompt) - seq.prefilled, budget - done)
                if size <= 0:
                    break
                done += size
                out.append((req, size))
            return out
        for req in self._prefilling:
            seq = req.seqs[0]
            left = len(seq.prompt) - seq.prefilled
            size = left if chunk is None else min(chunk, left)
            if done and (chunk is None or size > chunk - done):
                break
            done += size
            out.append((req, size))
        if out:
            self.stats.prefill_budget = chunk or done
        return out

    def _plain_step(self, live: list[tuple[Request, int]]) -> float | None:
        """The step-cost model's seconds for a step with no drafts of every sequence holding a slot
        (decoding, or prefilling: the batch being served, see :mod:`lookupspec.cost.chunk`); None
        before a step was measured."""
        steps = self.engine.costs.steps
        if not steps.known():
            return None
        contexts = [r.seqs[j].cache_len for r, j in live]
        contexts += [len(r.prompt) for r in self._prefilling for _ in range(r.n)]
        return steps.predict([1] * len(contexts), contexts)

    def _iterate(self) -> bool:
        """One engine forward: a step for every running sequence and this iteration's prompt chunks."""
        live = [(r, j) for r, j in self._running if r.seqs[j].running]
        self._running = list(live)  # a prompt finished in this forward joins from the next one
        chunks = self._chunks(live)
        if not live and not chunks:
            return False
        seqs = [r.seqs[j] for r, j in live]
        prefilled = sum(size for _, size in chunks)
        max_rows = None
        if self.max_batch_tokens is not None and live:
            max_rows = max(len(seqs), self.max_batch_tokens - prefilled)
        before = [req.seqs[0].prefilled for req, _ in chunks]
        if self.trace is not None:
            self._traced = {"forward_s": None, "decode_s": None, "sequences": len(live), "rows": len(live),
                            "draft_nodes": 0, "tokens": 0, "chunk_tokens": prefilled, "chunks": len(chunks),
                            "budget": self.stats.prefill_budget if chunks else None,
                            "waiting": len(self._waiting), "prefilling": len(self._prefilling)}
        try:
            it = self.engine.iterate(seqs, [(req.seqs[0], size) for req, size in chunks], max_rows)
        except Exception:
            log.exception("a batched forward failed; retrying its prompt chunks and sequences one at a time")
            for req, _ in chunks:
                self.engine.rollback(req.seqs[0])
            for req, size in chunks:
                self._prefill_alone(req, size)
            if live:
                t0 = time.perf_counter()
                self._observe(live, self._step_alone(live), time.perf_counter() - t0)
            return True
        if self._traced is not None:
            self._traced.update(forward_s=it.seconds, decode_s=it.decode_s)
        self.stats.prefill_s += it.seconds - it.decode_s
        if chunks and not live and self.budget is not None:  # seeds the chunk's price until the
            self.budget.observe_alone(prefilled, it.seconds)  # engine measures it in shared forwards
        for (req, _), first, start in zip(chunks, it.prefills, before, strict=True):
            self._prefilled(req, first, start)
        if live:
            self.stats.shared_forwards += bool(chunks)
            self._observe(live, list(it.steps), it.decode_s)
        return True

    def _prefill_alone(self, req: Request, size: int) -> None:
        seq = req.seqs[0]
        before = seq.prefilled
        t0 = time.perf_counter()
        try:
            first = self.engine.prefill(seq, size)
        except Exception as exc:
            self._prefilling.remove(req)
            self._end(req, exc)
            return
        self.stats.prefill_s += time.perf_counter() - t0
        self._prefilled(req, first, before)

    def _prefilled(self, req: Request, first: StepOutput | None, before: int) -> None:
        """Book a request's chunk; when its prompt is done, send its first token and fork its other
        choices from its cache (one prefill for ``n`` choices)."""
        seq = req.seqs[0]
        self.stats.prefill_tokens += seq.prefilled - before
        self.stats.prefill_chunks += 1
        if first is None:
            return
        outputs = [(0, first)]
        for j in range(1, req.n):  # the other choices share the prefill
            try:
                child, out = self.engine.fork(seq, req.params[j])
            except Exception as exc:
                req.open[j] = False
                req.sinks[j].fail(exc)
                continue
            req.seqs.append(child)
            outputs.append((j, out))
        for j, out in outputs:
            self._deliver(req, j, out)
        # out of _prefilling only once its choices are in _running (see _admit: the counts the
        # gateway's admission reads may be high for an instant, never low)
        self._prefilling.remove(req)

    def _observe(self, live: list[tuple[Request, int]], outs: list[StepOutput | None],
                 seconds: float) -> None:
        """Count a step (in the stats and the trace's record) and deliver its outputs."""
        nodes = sum(o.draft_tokens for o in outs if o is not None)
        tokens = sum(len(o.tokens) for o in outs if o is not None)
        self.stats.observe_step(len(live), len(live) + nodes, nodes, seconds, tokens)
        if self._traced is not None:
            self._traced.update(rows=len(live) + nodes, draft_nodes=nodes, tokens=tokens)
        for (req, j), out in zip(live, outs, strict=True):
            if out is not None:
                self._deliver(req, j, out)

    def _step_alone(self, live: list[tuple[Request, int]]) -> list[StepOutput | None]:
        """After a failed batched step: each sequence alone, so that only a failing one ends."""
        outs: list[StepOutput | None] = []
        for req, j in live:
            seq = req.seqs[j]
            self.engine.rollback(seq)
            try:
                outs.append(self.engine.step([seq])[0])
            except Exception as exc:
                log.exception("a sequence's step failed")
                self.engine.rollback(seq)
                self._end_choice(req, j, exc)
                outs.append(None)
        return outs

    # ---- outputs ----------------------------------------------------------------------------------

    def _deliver(self, req: Request, j: int, out: StepOutput) -> None:
        if not req.open[j]:
            return
        seq = req.seqs[j]
        try:
            keep = req.sinks[j].deliver(out)
        except Exception:  # a broken sink must not stop the loop
            log.exception("a sink failed")
            keep = False
        if out.finish_reason is not None:
            req.open[j] = False
            self.stats.finished += 1
        elif not keep:  # the consumer is done with it (a stop string)
            req.open[j] = False
            self.engine.release(seq)
            self.stats.finished += 1
        elif (req, j) not in self._running:
            self._running.append((req, j))
        if not req.open[j]:
            self._running = [(r, k) for r, k in self._running if not (r is req and k == j)]
            if self.budget is not None:
                prefilled = (len(seq.prompt) - seq.stats.cached_tokens) / req.n  # its share of the prefill
                self.budget.observe_sequence(prefilled, seq.stats.steps, seq.max_draft > 0)

    def _end_choice(self, req: Request, j: int, error: BaseException) -> None:
        if j < len(req.seqs):
            self.engine.release(req.seqs[j])
        if req.open[j]:
            req.open[j] = False
            self.stats.failed += 1
            try:
                req.sinks[j].fail(error)
            except Exception:
                log.exception("a sink failed")

    def _end(self, req: Request, error: BaseException) -> None:
        """End every open choice of ``req`` with ``error`` and free its slots."""
        for j in range(req.n):
            self._end_choice(req, j, error)
        self._running = [(r, k) for r, k in self._running if r is not req]
