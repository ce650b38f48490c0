"""After ``Engine.warmup`` no step launches a kernel variant the warm-up did not: greedy and seeded
trees and chains, sampled draft-model chains (rejection), batches of several sequences. The Triton
kernels run in the interpreter here, and the variant of each launch is the key Triton would compile
it under (``kernels.variants``), so a per-step integer that were still specialised on (the batch
size being 1, a node count divisible by 16, ...) or a block size the warm-up missed shows up."""

from __future__ import annotations

import os

import pytest
import torch
from lookupspec.kernels import variants  # imports no triton: the skip below still applies
from scripted import ScriptedDrafting

from lookupspec import kernels
from lookupspec.cost import BudgetPolicy
from lookupspec.engine import Engine
from lookupspec.params import GenerationParams, SpecParams
from lookupspec.sampling import SamplingParams

pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("needs CUDA or the Triton interpreter", allow_module_level=True)

FIXED = BudgetPolicy(adaptive=False)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=3)


def _plain(model, prompt, params):
    eng = Engine(model, lookup=ScriptedDrafting([], "none", 512))
    return [t for s in eng.generate(prompt, params, spec=SpecParams(enabled=False)) for t in s.tokens]


def test_no_step_launches_a_variant_the_warmup_did_not(tiny_models, tiny_draft, monkeypatch):
    from lookupspec.models import load_model

    monkeypatch.setenv(kernels.BACKEND_ENV, "triton")
    model = load_model(str(tiny_models["tiny-qwen2"])).model
    prompts = [list(range(40, 60)), list(range(100, 131)), list(range(7, 20))]
    greedy = GenerationParams(max_tokens=10)
    seeded = GenerationParams(max_tokens=10, sampling=SEEDED)
    truth = _plain(model, prompts[0], greedy)
    engine = Engine(model, draft_model=tiny_draft.model, lookup=ScriptedDrafting(truth, "tree", 512),
                    policy=FIXED, spec=SpecParams(max_draft_tokens=6, tree=True))
    with variants.recording() as warm:
        engine.warmup(sizes=(1, 4), batches=(1, 2), context=16)
    assert {k[0] for k in warm} >= {"_verify_rows_kernel", "_walk_kernel", "_compact_pool_kernel"}
    walk_blocks = {dict(k[1])["BLOCK_N"] for k in warm if k[0] == "_walk_kernel"}
    assert walk_blocks == {1, 2, 4, 8}  # tree sizes 0..6

    with variants.recording() as served:
        tree = SpecParams(max_draft_tokens=6, tree=True)
        chain = SpecParams(max_draft_tokens=3, tree=False)
        model_chain = SpecParams(max_draft_tokens=3, sources=("draft_model",))
        for params, spec in ((greedy, tree), (seeded, tree), (seeded, chain), (seeded, model_chain)):
            seqs = [engine.start(p, params, spec) for p in prompts]
            for s in seqs:
                engine.prefill(s)
            while any(s.running for s in seqs):
                engine.step([s for s in seqs if s.running])
            for s in seqs:
                engine.release(s)
    assert "_compact_pool_kernel" in {k[0] for k in served}
    assert any(dict(k[1])["MODE"] == 2 for k in served if k[0] == "_walk_kernel")  # rejection ran
    assert served <= warm, sorted(served - warm)


def test_per_step_integers_do_not_make_new_variants():
    from lookupspec.kernels import pack_requests, verify_triton

    keys = set()
    for batch, nodes in ((1, 3), (2, 3), (16, 3), (3, 4)):
        packed = pack_requests([([5] * nodes, list(range(-1, nodes - 1)))] * batch, [SEEDED] * batch,
                               [16 * b for b in range(batch)])
        logits = torch.randn(batch * (nodes + 1), 64)
        with variants.recording() as seen:
            verify_triton.verify_batch(logits, **packed._asdict(), mode="match")
        keys.add(frozenset(seen))
    assert len(keys) == 1  # batch 1, 2, 16 and node counts 3, 4 (one block size): the same variants
