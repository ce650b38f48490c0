"""The engine with ``cuda_graphs="on"`` on the CPU, where the static step runs eagerly: the same greedy
tokens as the default path, with speculation off and on (chains and draft trees), one sequence at a
time and several of different lengths in one forward with their prompt chunks; a model or a step the
static step cannot serve keeps the ragged path with one log line per reason; and ``auto`` on the CPU
is the default path itself (no static step, no scratch slot).

Exactness (docs/gpu.md): the static forward sums attention in another order than the ragged path,
so float32 logits may differ in their last bits and tokens only at near-ties. The tiny models'
logits are spread out (their configs' ``initializer_range``), so no step here sits on one and the
tokens must be identical; ``tests/runtime/static/test_static_serving.py`` counts near-ties row by
row."""

from __future__ import annotations

import logging

import pytest
import torch
from scripted import ScriptedDrafting
from tiny_engine import packed_model, plain_tokens
from torch_threads import torch_threads

from lookupspec.config import EngineConfig
from lookupspec.cost import BudgetPolicy
from lookupspec.engine import Engine
from lookupspec.params import GenerationParams, SpecParams
from lookupspec.runtime import ModelRunner, RaggedBatch, SeqRows
from lookupspec.runtime.static import BucketConfig, StepPlan

FIXED = BudgetPolicy(adaptive=False)  # verify every proposed node, so every path is exercised
STATIC = "lookupspec.runtime.static"
# the static forward covers these (mistral: one sliding window of 12 for every layer)
SERVED = ("tiny-llama", "tiny-qwen2", "tiny-mistral")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with torch_threads(1):
        yield


def _requests():
    """(prompt, params): greedy requests of several lengths (two past the sliding window of 12)."""
    gen = torch.Generator().manual_seed(7)
    out = []
    for i, (n, max_tokens) in enumerate([(20, 18), (45, 14), (7, 22), (33, 16)]):
        prompt = torch.randint(3, 512, (n,), generator=gen).tolist()
        params = GenerationParams(max_tokens=max_tokens, eos_token_ids=(2,), ignore_eos=i % 2 == 0)
        out.append((prompt, params))
    return out


_model = packed_model


def _plain(model, requests):
    """Each request's tokens on the default path (``auto`` on the CPU), batch of one, no speculation."""
    engine = Engine(model, lookup=ScriptedDrafting([], "none", 512))
    assert engine.runner.static is None
    return plain_tokens(engine, requests)


def _batched(engine, requests, spec, *, chunk):
    """Every request through ``Engine.iterate`` together, request i joining after 2 i steps: its
    prompt chunks (``chunk`` tokens) share forwards with the others' steps."""
    pending = list(enumerate(requests))
    live, out = [], {}
    steps = 0
    while pending or live:
        while pending and pending[0][0] * 2 <= steps:
            _, (prompt, params) = pending.pop(0)
            live.append((engine.start(prompt, params, spec), []))
        step = [(s, toks) for s, toks in live if s.prefill_done and s.running]
        pre = [(s, toks) for s, toks in live if not s.prefill_done]
        it = engine.iterate([s for s, _ in step], [(s, chunk) for s, _ in pre])
        for (_, toks), o in zip(step, it.steps, strict=True):
            toks.extend(o.tokens)
        for (_, toks), first in zip(pre, it.prefills, strict=True):
            toks.extend(first.tokens if first is not None else ())
        for s, toks in list(live):
            if s.finish_reason is not None:
                out[s.prompt] = toks
                live.remove((s, toks))
        steps += 1
    return out


def _static_only(engine, monkeypatch) -> None:
    """Make any forward that would take the ragged path fail: what passes ran on the static step."""
    def ragged(*args, **kwargs):
        raise AssertionError("a forward took the ragged path")

    monkeypatch.setattr(engine.runner, "lean", None)
    monkeypatch.setattr(engine.runner, "_hf", ragged)


@pytest.mark.parametrize("shape", ["none", "chain", "tree"])
@pytest.mark.parametrize("name", SERVED)
def test_the_static_step_gives_the_default_paths_greedy_tokens(tiny_models, name, shape, monkeypatch) -> None:
    model = _model(tiny_models, name)
    requests = _requests()
    plain = _plain(model, requests)
    engine = Engine(model, EngineConfig(cuda_graphs="on", max_batch=4, prefill_chunk=8),
                    lookup=ScriptedDrafting(plain, shape, 512), policy=FIXED)
    static = engine.runner.static
    assert static is not None and static.graphs is None  # the CPU: eager, no graphs
    assert engine.runner.pool.max_batch == 5 and engine.runner.pool.used[static.scratch]
    _static_only(engine, monkeypatch)
    spec = SpecParams(enabled=shape != "none", max_draft_tokens=8, tree=shape == "tree")
    alone = {tuple(p): [t for s in engine.generate(p, params, spec=spec) for t in s.tokens]  # chunks of 8
             for p, params in requests}
    assert alone == plain
    assert _batched(engine, requests, spec, chunk=8) == plain  # chunks and steps in one forward
    assert not static.fallbacks
    assert engine.runner.pool.in_use() == 1  # every sequence freed its slot; the scratch slot stays


def test_a_model_the_static_step_cannot_serve_keeps_the_default_path_with_one_log_line(
        tiny_models, caplog: pytest.LogCaptureFixture) -> None:
    model = _model(tiny_models, "tiny-gemma2")  # soft-capped attention logits, q/k scaling of its own
    requests = _requests()[:2]
    plain = _plain(model, requests)
    with caplog.at_level(logging.INFO, logger=STATIC):
        engine = Engine(model, EngineConfig(cuda_graphs="on", max_batch=4),
                        lookup=ScriptedDrafting(plain, "tree", 512))
        got = {tuple(p): [t for s in engine.generate(p, params, spec=SpecParams(max_draft_tokens=6))
                          for t in s.tokens] for p, params in requests}
    assert got == plain
    assert engine.runner.static is None and engine.runner.pool.max_batch == 4  # no scratch slot
    lines = [r for r in caplog.records if r.name == STATIC]
    assert [r.getMessage() for r in lines] == [
        "the static step cannot serve this model, its forwards take the ragged path: the static step "
        "covers llama, qwen2, mistral models, not gemma2"]
    assert lines[0].levelno == logging.WARNING  # asked for with "on"; "auto" would say it at INFO


def test_steps_no_bucket_holds_take_the_ragged_path_with_one_log_line_per_reason(
        tiny_models, caplog: pytest.LogCaptureFixture) -> None:
    model = _model(tiny_models, "tiny-llama")
    requests = _requests()
    plain = _plain(model, requests)
    engine = Engine(model, EngineConfig(cuda_graphs="on", max_batch=4, prefill_chunk=16),
                    lookup=ScriptedDrafting(plain, "tree", 512), policy=FIXED)
    static = engine.runner.static
    assert static is not None
    static.step.buckets = BucketConfig(rows=(1, 2, 4, 8, 16), seqs=(1, 2))  # small, so that steps outgrow it
    served = 0
    run = static.run

    def counted(plan, keep=None):
        nonlocal served
        served += 1
        return run(plan, keep)

    static.run = counted  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger=STATIC):
        got = _batched(engine, requests, SpecParams(max_draft_tokens=8, tree=True), chunk=16)
    assert got == plain  # forwards of either path, one sequence's steps on both
    lines = sorted(r.getMessage() for r in caplog.records if r.name == STATIC)
    assert lines == ["no static bucket holds steps of more than 16 rows: they take the ragged path",
                     "no static bucket holds steps of more than 2 sequences: they take the ragged path"]
    assert all(n > 1 for n in static.fallbacks.values()) and served > 0


@pytest.mark.parametrize("config", [EngineConfig(), EngineConfig(cuda_graphs="auto", max_batch=4),
                                    EngineConfig(cuda_graphs="off", max_batch=4)],
                         ids=["default", "auto", "off"])
def test_auto_on_the_cpu_is_the_default_path(tiny_models, config) -> None:
    model = _model(tiny_models, "tiny-llama")
    runner = Engine(model, config).runner
    assert runner.static is None and runner.pool.max_batch == runner.max_batch == config.max_batch
    slot = runner.allocate(8)
    assert isinstance(runner.plan([SeqRows(slot, [3, 4, 5])]), RaggedBatch)
    assert runner.pool.in_use() == 1  # the sequence's: no scratch slot
    assert ModelRunner(model, context_window=64, check=False).static is None  # the runner's own default: off


def test_the_static_runner_plans_a_static_step_and_warms_up(tiny_models) -> None:
    """Warm-up takes the runner's sequences (not the pool's slots, one of which is the scratch slot)
    and captures nothing where there are no graphs."""
    model = _model(tiny_models, "tiny-qwen2")
    engine = Engine(model, EngineConfig(cuda_graphs="on", max_batch=2))
    runner = engine.runner
    assert runner.static is not None and runner.static.capture(runner.max_batch) == []
    engine.warmup(sizes=(1, 2, 4, 8), batches=(1, 4), context=16)  # batches of 4: max_batch = 2 of them
    assert engine.costs.steps.known() and runner.pool.in_use() == 1
    slot = runner.allocate(8)
    plan = runner.plan([SeqRows(slot, [3, 4, 5])])
    assert isinstance(plan, StepPlan) and plan.bucket.rows == 4
    assert runner.run(plan).shape == (3, runner.vocab_size) and runner.length(slot) == 3


def test_the_budget_prices_buckets_where_the_static_step_serves(tiny_models) -> None:
    """Warm-up and every step price the buckets they ran in; the adaptive budget (filling buckets)
    keeps plain decoding's tokens; the ragged path has no bucket prices."""
    model = _model(tiny_models, "tiny-llama")
    requests = _requests()[:2]
    plain = _plain(model, requests)
    assert Engine(model, lookup=ScriptedDrafting(plain, "tree", 512)).costs.buckets is None
    engine = Engine(model, EngineConfig(cuda_graphs="on", max_batch=2),
                    lookup=ScriptedDrafting(plain, "tree", 512))
    buckets = engine.costs.buckets
    assert buckets is not None and buckets.known() == 0
    engine.warmup(sizes=(1, 2, 4, 8, 16), batches=(1, 2), context=16)
    assert buckets.known() >= 5 and buckets.lookup(9, 1)[1] is not None  # the 16-row bucket of one sequence
    ran = []
    plan = engine.runner.plan

    def record(seqs, stage=None):
        planned = plan(seqs, stage)
        ran.append((sum(len(s.tokens) for s in seqs), engine.runner.bucket_of(planned)))
        return planned

    engine.runner.plan = record
    before = {b: buckets.seconds(b) for b in BucketConfig().all()}
    spec = SpecParams(max_draft_tokens=12)
    got = {tuple(p): [t for s in engine.generate(p, params, spec=spec) for t in s.tokens]
           for p, params in requests}
    assert got == plain
    steps = {b for rows, b in ran if b is not None and 1 < rows <= 13}  # decode steps with drafts
    assert steps  # drafts were verified in buckets ...
    assert any(buckets.seconds(b) != before[b] for b in steps)  # ... whose prices the steps updated
