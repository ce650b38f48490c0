"""The CUDA-graph runner: its decisions everywhere (which mode captures, why a step runs eagerly, the
log line once per reason, buffers that keep their address), and on a CUDA machine the graphs
themselves (replay equals the eager static step bit for bit, in float32 and bfloat16; no host sync
in a replayed step; a pool that grew is recaptured)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from lookupspec.runtime import ModelRunner, SeqRows
from lookupspec.runtime.static import Bucket, BucketConfig, GraphStep, StaticStep, graph_unsupported

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "models"
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _step(device: str = "cpu", dtype=torch.float32, **kw) -> StaticStep:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(FIXTURES / "tiny-mistral" / "config.json"))  # a sliding window
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).to(device).eval()
    runner = ModelRunner(model, context_window=256, max_batch=8, check=False, lean=False)
    return StaticStep(model, runner.pool, **kw)


def test_which_modes_capture() -> None:
    assert graph_unsupported("auto", torch.device("cuda")) is None
    assert graph_unsupported("on", torch.device("cuda", 1)) is None
    assert "off" in (graph_unsupported("off", torch.device("cuda")) or "")
    assert "need a CUDA device" in (graph_unsupported("auto", torch.device("cpu")) or "")
    with pytest.raises(ValueError, match="on, but"):
        graph_unsupported("on", torch.device("cpu"))
    with pytest.raises(ValueError, match="one of"):
        graph_unsupported("yes", torch.device("cuda"))


def test_off_cuda_every_step_runs_eagerly_and_says_why_once(caplog: pytest.LogCaptureFixture) -> None:
    step = _step()
    graphs = GraphStep(_step(), "auto")  # a second step over a pool of its own, same weights
    assert not graphs.enabled
    a, b = step.pool.allocate(64), graphs.step.pool.allocate(64)
    with caplog.at_level(logging.INFO, logger="lookupspec.runtime.static"):
        for tokens in ([3, 4, 5, 6, 7], [8], [9, 10]):
            want = step.forward_rows([SeqRows(a, tokens)])
            got = graphs.run(graphs.step.plan([SeqRows(b, tokens)]))
            assert torch.equal(got, want)
    lines = [r.getMessage() for r in caplog.records if "eagerly" in r.getMessage()]
    assert lines == ["static step runs eagerly: CUDA graphs need a CUDA device (the model runs on cpu)"]
    assert sum(graphs.fallbacks.values()) == 3 and graphs.captures == 0
    graphs.capture()  # nothing to capture off CUDA
    assert graphs.captures == 0


def test_a_step_no_bucket_holds_runs_eagerly_in_a_bucket_of_its_own_size() -> None:
    step = _step(buckets=BucketConfig(rows=(1, 2, 4), seqs=(1, 2)))
    a, b, c = (step.pool.allocate(64) for _ in range(3))
    plan = step.plan([SeqRows(a, [3, 4, 5, 6, 7])])
    assert plan.bucket == Bucket(5, 1) and plan.fallback == "5 rows exceed the largest bucket (4 rows)"
    three = step.plan([SeqRows(b, [3]), SeqRows(c, [4]), SeqRows(a, [5])])
    assert three.fallback == "3 sequences exceed the largest bucket (2 sequences)"
    graphs = GraphStep(step, "off")
    assert graphs.why_eager(plan) == "CUDA graphs are off"
    graphs.reason = None  # as on a CUDA device: the plan's own reason decides
    assert graphs.why_eager(plan) == plan.fallback
    assert graphs.why_eager(step.plan([SeqRows(b, [3, 4])])) is None
    assert step.run(plan).shape == (5, 512)
    assert Bucket(5, 1) not in step._inputs  # an exact-sized bucket's buffers are not kept


def test_each_bucket_keeps_one_input_buffer() -> None:
    step = _step()
    a = step.pool.allocate(64)
    first = step.upload(step.plan([SeqRows(a, [3, 4, 5])]))
    step.pool.truncate(a, 0)
    again = step.upload(step.plan([SeqRows(a, [6, 7, 8, 9])]))  # another step, same bucket (4 rows)
    assert again.input_ids.data_ptr() == first.input_ids.data_ptr()
    assert again.input_ids.tolist() == [6, 7, 8, 9]
    buffer = step.inputs(Bucket(4, 1)).device  # the one buffer the bucket's graph would read
    assert buffer.shape == (step.table(Bucket(4, 1)).size,) and buffer.dtype == torch.int64
    assert first.input_ids.data_ptr() == buffer.data_ptr()


# ---- on a CUDA machine ----------------------------------------------------------------------------


def _decode(step_run, step: StaticStep, slots: list[int], prompts: list[list[int]], steps: int) -> list:
    """Greedy decoding of every slot for ``steps`` steps (a draft tree on the first sequence every
    other step, its rejected nodes dropped); the logits of each step."""
    out = []
    tokens = [p[-1] for p in prompts]
    for k in range(steps):
        seqs = [SeqRows(s, [t, 5, 6, 7], [-1, 0, 0, 1]) if i == 0 and k % 2 else SeqRows(s, [t])
                for i, (s, t) in enumerate(zip(slots, tokens, strict=True))]
        logits = step_run(step.plan(seqs)).clone()
        out.append(logits)
        row = 0
        for i, s in enumerate(seqs):
            tokens[i] = int(logits[row].argmax())
            row += len(s.tokens)
            step.pool.truncate(s.slot, int(step.pool.length[s.slot]) - len(s.tokens) + 1)
    return out


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_replaying_a_graph_gives_the_eager_steps_bits(dtype) -> None:
    eager, graphed = _step("cuda", dtype), _step("cuda", dtype)
    graphs = GraphStep(graphed, "auto")
    prompts = [list(range(3, 3 + n)) for n in (40, 9, 23)]
    slots = {}
    for step in (eager, graphed):
        slots[id(step)] = [step.pool.allocate(128) for _ in prompts]
        for s, p in zip(slots[id(step)], prompts, strict=True):
            step.forward_rows([SeqRows(s, p)])
    want = _decode(eager.run, eager, slots[id(eager)], prompts, 6)
    got = _decode(graphs.run, graphed, slots[id(graphed)], prompts, 6)
    assert graphs.captures == 2 and not graphs.fallbacks  # buckets (4, 4) and (8, 4)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"step {k}: max difference {(g.float() - w.float()).abs().max():.3g}"


@cuda
def test_a_replayed_step_does_not_sync_with_the_host() -> None:
    step = _step("cuda")
    graphs = GraphStep(step, "auto")
    a = step.pool.allocate(128)
    step.forward_rows([SeqRows(a, list(range(3, 40)))])
    plan = step.plan([SeqRows(a, [5])])
    graphs.run(plan)  # captures
    step.pool.truncate(a, 37)
    plan = step.plan([SeqRows(a, [5])])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        graphs.run(plan)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@cuda
def test_a_pool_that_grew_is_recaptured() -> None:
    step = _step("cuda")
    graphs = GraphStep(step, "auto")
    a = step.pool.allocate(8)
    graphs.run(step.plan([SeqRows(a, [3])]))
    assert graphs.captures == 1
    b = step.pool.allocate(250)  # more slots and capacity: the pool reallocates
    graphs.run(step.plan([SeqRows(b, [4])]))
    assert graphs.captures == 2
