"""The scheduler: requests run together in one loop and each gets exactly its batch-of-one tokens;
n choices share a prefill; cancellation, deadlines, failures and shutdown end only their own request."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch
from scripted import ScriptedDrafting

from lookupspec.cost import BudgetPolicy
from lookupspec.engine import Engine
from lookupspec.iteration_trace import IterationTrace
from lookupspec.params import GenerationParams, SpecParams
from lookupspec.runtime import pack_linears, packing_available
from lookupspec.sampling import SamplingParams
from lookupspec.scheduler import Cancelled, DeadlineExceeded, QueueFull, Scheduler


class Collect:
    """A sink that keeps every token; ``stop_after`` tokens make it stop the sequence."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.tokens: list[int] = []
        self.reason: str | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.stop_after = stop_after

    def deliver(self, out) -> bool:
        self.tokens.extend(out.tokens)
        if out.finish_reason is not None:
            self.reason = out.finish_reason
            self.done.set()
            return True
        if self.stop_after is not None and len(self.tokens) >= self.stop_after:
            self.reason = "stopped"
            self.done.set()
            return False
        return True

    def fail(self, error) -> None:
        self.error = error
        self.done.set()


def _requests(n=6):
    gen = torch.Generator().manual_seed(5)
    out = []
    for i in range(n):
        length = int(torch.randint(8, 70, (1,), generator=gen))
        prompt = torch.randint(3, 512, (length,), generator=gen).tolist()
        sampling = SamplingParams() if i % 2 == 0 else SamplingParams(temperature=0.8, seed=40 + i)
        out.append((prompt, GenerationParams(max_tokens=16 + 3 * i, sampling=sampling, eos_token_ids=(2,))))
    return out


@pytest.fixture(scope="module")
def model(tiny_models):
    from lookupspec.models import load_model

    m = load_model(str(tiny_models["tiny-qwen2"])).model
    if packing_available():
        pack_linears(m)
    return m


def _engine(model, requests, **kw):
    plain = Engine(model, lookup=ScriptedDrafting([], "none", 512))
    off = SpecParams(enabled=False)
    truth = {tuple(p): [t for s in plain.generate(p, params, spec=off) for t in s.tokens]
             for p, params in requests}
    engine = Engine(model, lookup=ScriptedDrafting(truth, "tree", 512), policy=BudgetPolicy(adaptive=False),
                    **kw)
    return engine, truth


def _drain(sched, sinks, limit=2000):
    for _ in range(limit):
        if all(s.done.is_set() for s in sinks):
            return
        sched.run_once()
    raise AssertionError("the scheduler did not finish")


def _records(path) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert "start" in lines[0]
    return lines[1:]


def test_requests_run_together_and_each_gets_its_own_tokens(model, tmp_path) -> None:
    requests = _requests()
    engine, truth = _engine(model, requests, prefill_chunk=16)
    trace = IterationTrace(tmp_path / "trace.jsonl")
    sched = Scheduler(engine, max_batch=3, max_batch_tokens=64, trace=trace)
    sinks = [Collect() for _ in requests]
    for (prompt, params), sink in zip(requests, sinks, strict=True):
        sched.submit(prompt, [(params, sink)], SpecParams(max_draft_tokens=6))
    assert sched.waiting == len(requests)
    choose, shared = engine.drafting.choose_batch, []

    def spy(seqs, rooms, contexts, max_rows=None, shared_forward=False):
        shared.append(shared_forward)
        return choose(seqs, rooms, contexts, max_rows, shared_forward)

    engine.drafting.choose_batch = spy
    for _ in range(5):  # a measured step cost (the server's warm-up seeds it), far below the real one
        engine.costs.steps.observe([1], [10], 1e-5)
    _drain(sched, sinks)
    assert [s.tokens for s in sinks] == [truth[tuple(p)] for p, _ in requests]
    assert all(s.error is None for s in sinks)
    st = sched.stats
    assert st.steps < sum(len(s.tokens) for s in sinks)  # batched and speculative
    assert max(st.by_batch) == 3  # never more than max_batch in a step
    assert st.step_rows <= 64 * st.steps
    assert st.shared_forwards > 0  # prompt chunks rode on steps' forwards
    # the policy is told which forwards carry a chunk, and what a chunk token costs there is measured
    assert shared.count(True) == st.shared_forwards and False in shared
    assert engine.costs.steps.chunk_row_s > 0
    assert st.prefill_s > 0 and st.decode_s > 0
    assert engine.runner.pool.in_use() == 0
    # the trace has one record per forward, and they add up to what ran
    trace.close()
    recs = _records(tmp_path / "trace.jsonl")
    assert sum(r["sequences"] > 0 for r in recs) == st.steps
    assert sum(r["chunk_tokens"] for r in recs) == sum(len(p) for p, _ in requests)
    # every token but each request's first (its prefill's) came from a step
    assert sum(r["tokens"] for r in recs) == sum(len(s.tokens) for s in sinks) - len(requests)
    assert sum(r["draft_nodes"] for r in recs) == st.step_rows - st.step_seqs
    assert sum(r["sequences"] > 0 and r["chunks"] > 0 for r in recs) == st.shared_forwards
    for r in recs:
        assert r["rows"] == r["sequences"] + r["draft_nodes"] and r["rows"] + r["chunk_tokens"] <= 64
        assert 0 <= r["decode_s"] <= r["forward_s"] <= r["iteration_s"]
        assert (r["budget"] is None) == (r["chunks"] == 0) and r["waiting"] >= 0
    assert [r["t"] for r in recs] == sorted(r["t"] for r in recs)


def test_n_choices_share_one_prefill(model) -> None:
    prompt, _ = _requests(1)[0]
    engine, _ = _engine(model, [])
    engine.prefill_chunk = 8
    choices = [GenerationParams(max_tokens=12, sampling=SamplingParams(temperature=1.0, seed=7 + j))
               for j in range(3)]
    off = SpecParams(enabled=False)
    alone = [[t for s in engine.generate(prompt, p, spec=off) for t in s.tokens] for p in choices]
    sched = Scheduler(engine, max_batch=4)
    sinks = [Collect() for _ in choices]
    sched.submit(prompt, list(zip(choices, sinks, strict=True)), SpecParams(enabled=False))
    _drain(sched, sinks)
    assert [s.tokens for s in sinks] == alone
    assert len({tuple(s.tokens) for s in sinks}) > 1  # the seeds differ
    assert sched.stats.prefill_tokens == len(prompt)  # the prompt was prefilled once


def test_cancel_deadline_stop_and_failure_end_only_their_own_request(model) -> None:
    requests = _requests(5)
    engine, truth = _engine(model, requests)
    sched = Scheduler(engine, max_batch=5)
    sinks = [Collect(), Collect(), Collect(stop_after=3), Collect(), Collect()]
    reqs = []
    for i, ((prompt, params), sink) in enumerate(zip(requests, sinks, strict=True)):
        deadline = time.perf_counter() - 1 if i == 1 else None  # already past
        reqs.append(sched.submit(prompt, [(params, sink)], SpecParams(max_draft_tokens=4), deadline=deadline))

    class Boom(Exception):
        pass

    broken = engine.lookup.session
    def session(context, spec, scope):
        s = broken(context, spec, scope)
        if tuple(context) == tuple(requests[3][0]):
            s.propose = lambda *a, **k: (_ for _ in ()).throw(Boom("drafting failed"))
        return s
    engine.lookup.session = session
    sched.run_once()
    reqs[0].cancel()
    _drain(sched, sinks)
    assert isinstance(sinks[0].error, Cancelled) and sinks[0].reason is None
    assert isinstance(sinks[1].error, DeadlineExceeded) and sinks[1].tokens == []
    assert sinks[2].reason == "stopped" and len(sinks[2].tokens) >= 3
    assert isinstance(sinks[3].error, Boom)
    assert sinks[4].tokens == truth[tuple(requests[4][0])] and sinks[4].error is None  # untouched
    assert engine.runner.pool.in_use() == 0


def test_a_shared_forward_that_fails_is_retried_in_parts(model, tmp_path) -> None:
    """A forward carrying prompt chunks and a step raises (once, after writing its KV): the chunks are
    rolled back and run alone, the step runs sequence by sequence, and every request still gets its
    own tokens."""
    requests = _requests(4)
    engine, truth = _engine(model, requests, prefill_chunk=8)
    trace = IterationTrace(tmp_path / "trace.jsonl")
    sched = Scheduler(engine, max_batch=4, trace=trace)
    sinks = [Collect() for _ in requests]
    for (prompt, params), sink in zip(requests, sinks, strict=True):
        sched.submit(prompt, [(params, sink)], SpecParams(max_draft_tokens=4))
    real = engine.runner.run
    failed = []

    def run(batch, keep=None):
        logits = real(batch, keep)  # the KV of every row is written and the slots advanced ...
        if keep is not None and len(batch.views) > 1 and not failed:  # ... a chunk shares a step
            failed.append(batch.real_rows)
            raise RuntimeError("the forward failed")
        return logits

    engine.runner.run = run
    _drain(sched, sinks)
    assert failed
    assert [s.tokens for s in sinks] == [truth[tuple(p)] for p, _ in requests]
    assert all(s.error is None for s in sinks)
    assert engine.runner.pool.in_use() == 0
    # the failed forward has its record, with no forward time (its parts ran alone)
    trace.close()
    recs = _records(tmp_path / "trace.jsonl")
    broken = [r for r in recs if r["forward_s"] is None]
    assert len(broken) == 1 and broken[0]["chunks"] > 0 and broken[0]["tokens"] >= broken[0]["sequences"]
    assert all(r["forward_s"] > 0 for r in recs if r is not broken[0])


def test_threads_submit_concurrently_and_stop_cancels_the_rest(model) -> None:
    requests = _requests(6)
    engine, truth = _engine(model, requests)
    sched = Scheduler(engine, max_batch=4, max_waiting=8)
    sched.start()
    sinks = [Collect() for _ in requests]
    spec = SpecParams(max_draft_tokens=4)
    threads = [threading.Thread(target=sched.submit, args=(p, [(params, sink)], spec))
               for (p, params), sink in zip(requests, sinks, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in sinks:
        assert s.done.wait(60)
    assert [s.tokens for s in sinks] == [truth[tuple(p)] for p, _ in requests]
    long = Collect()
    sched.submit(requests[0][0], [(GenerationParams(max_tokens=2000, ignore_eos=True), long)])
    while not long.tokens:
        time.sleep(0.01)
    sched.stop()
    assert isinstance(long.error, Cancelled) and long.error.reason == "shutdown"
    assert not sched.alive and engine.runner.pool.in_use() == 0
    with pytest.raises(Cancelled):
        sched.submit(requests[0][0], [(requests[0][1], Collect())])


def test_queue_limit(model) -> None:
    engine, _ = _engine(model, [])
    sched = Scheduler(engine, max_batch=1, max_waiting=1)
    prompt, params = _requests(1)[0]
    sched.submit(prompt, [(params, Collect())])
    with pytest.raises(QueueFull):
        sched.submit(prompt, [(params, Collect())])
    with pytest.raises(ValueError, match="max_batch_tokens"):
        Scheduler(engine, max_batch=8, max_batch_tokens=4)


def test_the_chunk_ceiling_is_two_blocks_leaving_a_row_per_slot_and_never_below_a_block(model) -> None:
    chunk = 32
    engine, _ = _engine(model, [], prefill_chunk=chunk)
    assert Scheduler(engine, max_batch=8).budget.ceiling == 2 * chunk
    assert Scheduler(engine, max_batch=8, max_batch_tokens=8 + chunk + 10).budget.ceiling == chunk + 10
    assert Scheduler(engine, max_batch=8, max_batch_tokens=8 + chunk).budget.ceiling == chunk


def test_chunks_follow_the_load_and_the_tokens_do_not_change(model) -> None:
    """While sequences decode, a chunk-invariant forward takes smaller prompt chunks (the stretch asks
    for forwards close to a plain step: the 16-token minimum), ending wherever the budget does; with
    nothing decoding it takes the ceiling (two chunks), filled from the next prompt; a prefill behind
    the decode takes chunks past the block while sequences decode. Every request still gets exactly
    its batch-of-one tokens, and the prefix blocks completed by those chunks are kept and give a later
    prompt the same tokens."""
    gen = torch.Generator().manual_seed(9)
    head = torch.randint(3, 512, (70,), generator=gen).tolist()
    requests = [(head + torch.randint(3, 512, (n,), generator=gen).tolist(),
                 GenerationParams(max_tokens=20, sampling=SamplingParams() if n % 2 else
                                  SamplingParams(temperature=0.8, seed=n), eos_token_ids=(2,)))
                for n in (9, 41, 23, 60, 5)]
    engine, truth = _engine(model, requests, prefill_chunk=32, prefix_cache_bytes=32 << 20)
    if not engine.free_chunks:
        pytest.skip("the native CPU attention is not available: chunks stay whole")
    engine.warmup()  # seeds the step-cost model
    sched = Scheduler(engine, max_batch=3, prefill_stretch=1.05)
    sched.budget.headroom = 0.0  # no floor for the prefill's pace (test_chunk_budget covers it)
    sizes: list[tuple[bool, int, int]] = []  # per forward with chunks: (shrunk?, chunk tokens, prompts left)
    real = engine.iterate

    def iterate(seqs, prefills=(), max_rows=None):
        if prefills:
            shrunk = bool(seqs)
            left = sum(len(s.prompt) - s.prefilled for s, _ in prefills)
            sizes.append((shrunk, sum(n for _, n in prefills), left))
        return real(seqs, prefills, max_rows)

    engine.iterate = iterate

    def serve(sched):
        """Every request through ``sched``: each must get its batch-of-one tokens."""
        sizes.clear()
        sinks = [Collect() for _ in requests]
        for (prompt, params), sink in zip(requests, sinks, strict=True):
            sched.submit(prompt, [(params, sink)], SpecParams(max_draft_tokens=4), namespace="ns")
        _drain(sched, sinks)
        assert [s.tokens for s in sinks] == [truth[tuple(p)] for p, _ in requests]
        assert all(s.error is None for s in sinks)

    prices: list[tuple[float | None, float | None]] = []  # (price passed, the engine's price then)
    sized = sched.budget.tokens

    classes: list[tuple[int, int]] = []  # (slots, speculating slots) per budget asked

    def tokens(plain_step_s, slots=1, per_token=None, speculating=0):
        prices.append((per_token, engine.costs.steps.chunk_row_s))
        classes.append((slots, speculating))
        return sized(plain_step_s, slots, per_token, speculating)

    sched.budget.tokens = tokens
    serve(sched)
    shrunk = [n for small, n, _ in sizes if small]
    assert shrunk and max(shrunk) <= 16
    # the chunk's price is the engine's one measurement (the drafting policy's too); the forwards
    # with no step only seed it
    assert prices and all(given == measured for given, measured in prices)
    # every request drafts: every slot counts as speculating, and the finished ones' steps are kept
    # as the speculating class's
    assert classes and all(spec == slots for slots, spec in classes)
    assert set(sched.budget.steps) == {True}
    assert any(given is not None for given, _ in prices) and sched.budget.alone is not None
    assert all(n == min(64, left) for small, n, left in sizes if not small)  # the ceiling, filled
    assert any(n == 64 for small, n, _ in sizes if not small)
    assert engine.prefix_cache.stats.stored > 0 and engine.prefix_cache.stats.hit_tokens > 0
    assert engine.runner.pool.in_use() == 0
    # a prefill falling behind the decode (a floor of 100x the pace) takes chunks past the block, up
    # to the ceiling, while sequences decode; the same tokens, with no prefix cache to lean on
    engine.prefix_cache.clear()
    sched = Scheduler(engine, max_batch=3, prefill_stretch=1.05)
    sched.budget.headroom = 100.0
    serve(sched)
    assert any(small and n > 32 for small, n, _ in sizes)  # past the block while decoding
    assert all(n <= 64 for _, n, _ in sizes)
    # whole chunks when the stretch is 0, and the same tokens again (from the prefix cache's blocks)
    serve(Scheduler(engine, max_batch=3, prefill_stretch=0))
    assert sizes and all(n == min(32, left) for _, n, left in sizes)
