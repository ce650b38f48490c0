"""The static step as the runner's forward (``ModelRunner(cuda_graphs=...)``,
:mod:`lookupspec.runtime.static.serving`): its logits against the default runner's row by row,
near-ties counted; and on a CUDA machine, ``auto`` turning it on, warm-up capturing the common
buckets' graphs and the engine's steps replaying them with the default path's tokens.

Exactness (docs/gpu.md): the static forward sums attention in another order than the ragged path,
so float32 logits may differ by a few units in their last place (measured ~1e-6 of their scale; the
bound is :data:`TOL`), and a greedy token only where the top two logits are within twice that
difference of each other: a near-tie. The tiny models' logits are spread out, so there must be none."""

from __future__ import annotations

import pytest
import torch

from lookupspec.config import EngineConfig
from lookupspec.engine import Engine
from lookupspec.params import GenerationParams, SpecParams
from lookupspec.runtime import ModelRunner, SeqRows, pack_linears, packing_available
from lookupspec.runtime.static import COMMON_ROWS, BucketConfig

TOL = 1e-4  # of the logits' scale
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _model(tiny_models, name: str, device: str = "cpu"):
    from lookupspec.models import load_model

    model = load_model(str(tiny_models[name]), device=device, log=lambda _: None).model
    if device == "cpu" and packing_available():
        pack_linears(model)
    return model


def _compare(got: torch.Tensor, want: torch.Tensor, what: str) -> int:
    """Rows whose greedy token differs (each must be a near-tie); asserts the logits within TOL."""
    got, want = got.float(), want.float()
    scale = max(1.0, float(want.abs().max()))
    diff = (got - want).abs().amax(-1)  # [rows]
    assert float(diff.max()) <= TOL * scale, f"{what}: max logit difference {float(diff.max()):.3g}"
    top2 = want.topk(2, dim=-1).values
    margin = top2[:, 0] - top2[:, 1]
    differ = got.argmax(-1) != want.argmax(-1)
    beyond = differ & (margin > 2 * diff)
    assert not bool(beyond.any()), f"{what}: tokens differ beyond a near-tie in rows {beyond.nonzero()}"
    return int(differ.sum())


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral"])
def test_the_static_runner_gives_the_default_runners_logits_up_to_near_ties(tiny_models, name,
                                                                            device) -> None:
    model = _model(tiny_models, name, device)
    ref = ModelRunner(model, context_window=256, max_batch=4)
    static = ModelRunner(model, context_window=256, max_batch=4, cuda_graphs="on")
    assert ref.static is None and static.static is not None
    assert (static.static.graphs is not None) == (device == "cuda")
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 512, (n,), generator=gen).tolist() for n in (9, 30, 17)]
    ties = 0
    slots = {}
    for r in (ref, static):
        slots[id(r)] = [r.allocate(64) for _ in prompts]
    for k, p in enumerate(prompts):  # prompts in chunks of 8: each chunk's last row (forward with keep)
        for lo in range(0, len(p), 8):
            got, want = (r.prefill(slots[id(r)][k], p[lo:lo + 8])[None] for r in (static, ref))
            ties += _compare(got, want, f"prompt {k} chunk at {lo}")

    def rows(r: ModelRunner) -> list[SeqRows]:
        a, b, c = slots[id(r)]
        return [SeqRows(a, [5]), SeqRows(b, [6, 7, 8, 9, 10], [-1, 0, 0, 1, 3]), SeqRows(c, [11, 12, 13, 14])]

    for step in range(3):  # a decode row, a draft tree and a causal chunk in one forward
        got, want = (r.forward(rows(r)) for r in (static, ref))
        ties += _compare(got, want, f"mixed step {step}")
        for r in (static, ref):  # the tree's nodes rejected: keep the root only
            r.pool.truncate(slots[id(r)][1], r.length(slots[id(r)][1]) - 4)
    assert ties == 0  # the tiny models have no near-ties at these rows


# ---- on a CUDA machine ----------------------------------------------------------------------------


@cuda
def test_auto_is_on_under_cuda(tiny_models) -> None:
    model = _model(tiny_models, "tiny-llama", "cuda")
    runner = Engine(model, EngineConfig(max_batch=4)).runner
    assert runner.static is not None and runner.static.graphs is not None
    assert runner.pool.max_batch == 5 and runner.pool.used[runner.static.scratch]
    off = Engine(model, EngineConfig(max_batch=4, cuda_graphs="off")).runner
    assert off.static is None and off.pool.max_batch == 4


@cuda
def test_warm_up_captures_the_common_buckets_and_the_engines_steps_replay_them(tiny_models) -> None:
    model = _model(tiny_models, "tiny-llama", "cuda")
    # a reserved KV budget: the pool never reallocates, so no graph is recaptured
    config = EngineConfig(max_batch=4, kv_cache_bytes=8 << 20, prefill_chunk=16)
    engine = Engine(model, config)
    graphs = engine.runner.static.graphs  # type: ignore[union-attr]
    engine.warmup(sizes=(1, 8, 16), batches=(1, 4), context=32)
    want = {b for b in BucketConfig().all() if b.rows <= COMMON_ROWS and b.seqs <= 4}
    assert set(graphs._graphs) == want and graphs.captures == len(want) == 18
    replays = 0
    run = graphs.run

    def counted(plan):
        nonlocal replays
        replays += 1
        return run(plan)

    graphs.run = counted  # type: ignore[method-assign]
    reference = Engine(model, EngineConfig(max_batch=4, cuda_graphs="off", prefill_chunk=16))
    gen = torch.Generator().manual_seed(5)
    phrase = torch.randint(3, 512, (6,), generator=gen).tolist()
    prompts = [phrase * 4 + torch.randint(3, 512, (n,), generator=gen).tolist() for n in (3, 20, 9)]
    params = GenerationParams(max_tokens=24, ignore_eos=True)
    spec = SpecParams(max_draft_tokens=8, tree=True)  # lookup drafts from the repeated phrase
    for prompt in prompts:
        want_tokens = [t for s in reference.generate(prompt, params, spec=spec) for t in s.tokens]
        got_tokens = [t for s in engine.generate(prompt, params, spec=spec) for t in s.tokens]
        assert got_tokens == want_tokens
    seqs = [engine.start(p, params, spec) for p in prompts]  # several sequences in one forward
    for s in seqs:
        engine.prefill(s)
    while any(s.running for s in seqs):
        engine.step([s for s in seqs if s.running])
    assert replays > 0 and not graphs.fallbacks and not engine.runner.static.fallbacks  # type: ignore[union-attr]
    assert graphs.captures == len(want)  # every step's bucket was captured at warm-up
