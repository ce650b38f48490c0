"""Engine.step over many sequences: every sequence gets exactly its batch-of-one tokens (greedy and
seeded sampling, chains and trees, sliding-window families), sequences join and leave mid-flight with
chunked prefills between steps or in the same forward as the steps (Engine.iterate), and a sequence
whose KV slot cannot grow ends alone with "length"."""

from __future__ import annotations

import pytest
import torch
from scripted import ScriptedDrafting
from tiny_engine import packed_model, plain_tokens

from lookupspec.config import EngineConfig
from lookupspec.cost import BudgetPolicy
from lookupspec.engine import Engine
from lookupspec.params import GenerationParams, SpecParams
from lookupspec.runtime import packing_available
from lookupspec.sampling import SamplingParams
from lookupspec.tiny import TINY_MODELS

FIXED = BudgetPolicy(adaptive=False)  # verify every proposed node, so every path is exercised
GREEDY = SamplingParams()
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=3)


def _requests():
    """(prompt, params): prompts of several lengths (some past the sliding fixtures' window of 12)."""
    gen = torch.Generator().manual_seed(7)
    out = []
    for i, (n, max_tokens, sampling) in enumerate([(20, 30, GREEDY), (45, 24, SEEDED), (7, 36, GREEDY),
                                                   (33, 18, SamplingParams(temperature=0.7, seed=11)),
                                                   (60, 28, GREEDY)]):
        prompt = torch.randint(3, 512, (n,), generator=gen).tolist()
        out.append((prompt, GenerationParams(max_tokens=max_tokens, sampling=sampling, eos_token_ids=(2,),
                                             ignore_eos=i % 2 == 0)))
    return out


_model = packed_model


def _plain(model, requests):
    return plain_tokens(Engine(model, lookup=ScriptedDrafting([], "none", 512)), requests)


def _batched(engine, requests, spec, *, chunk=None, stagger=0, shared=False):
    """Run every request through Engine.step together; request i joins after i * stagger steps and
    prefills ``chunk`` tokens per step while the others decode: in forwards of their own, or with
    ``shared`` in the steps' forwards (Engine.iterate)."""
    pending = list(enumerate(requests))
    live, out = [], {}
    steps = 0
    while pending or live:
        while pending and pending[0][0] * stagger <= steps:
            _, (prompt, params) = pending.pop(0)
            live.append((engine.start(prompt, params, spec), []))
        ready = [(s, toks) for s, toks in live if s.prefill_done]
        step = [(s, toks) for s, toks in ready if s.running]
        if shared:
            pre = [(s, toks) for s, toks in live if not s.prefill_done]
            it = engine.iterate([s for s, _ in step], [(s, chunk) for s, _ in pre])
            for (_, toks), o in zip(step, it.steps, strict=True):
                toks.extend(o.tokens)
            for (_, toks), first in zip(pre, it.prefills, strict=True):
                toks.extend(first.tokens if first is not None else ())
        else:
            for s, toks in live:
                if not s.prefill_done:
                    first = engine.prefill(s, chunk)
                    if first is not None:
                        toks.extend(first.tokens)
            for (_, toks), o in zip(step, engine.step([s for s, _ in step]) if step else [], strict=True):
                toks.extend(o.tokens)
        for s, toks in list(live):
            if s.finish_reason is not None:
                out[s.prompt] = toks
                live.remove((s, toks))
        steps += 1
    return out


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("name", TINY_MODELS)
def test_batched_steps_give_every_sequence_its_own_tokens(tiny_models, name, shape) -> None:
    model = _model(tiny_models, name)
    requests = _requests()
    plain = _plain(model, requests)
    engine = Engine(model, lookup=ScriptedDrafting(plain, shape, 512), policy=FIXED)
    assert engine.runner.batch_invariant or not packing_available()
    spec = SpecParams(max_draft_tokens=8, tree=shape == "tree")
    alone = {tuple(p): [t for s in engine.generate(p, params, spec=spec) for t in s.tokens]
             for p, params in requests}
    assert alone == plain
    together = _batched(engine, requests, spec)
    assert together == alone
    staggered = _batched(engine, requests, spec, chunk=8, stagger=3)  # joins mid-flight, chunked prefill
    assert staggered == alone
    shared = _batched(engine, requests, spec, chunk=8, stagger=3, shared=True)  # chunks in steps' forwards
    assert shared == alone
    assert _batched(engine, requests, spec, stagger=2, shared=True) == alone  # whole prompts in a forward
    assert engine.runner.pool.in_use() == 0  # every finished sequence freed its slot


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_a_prompt_chunk_sharing_a_step_writes_the_cache_and_logits_of_its_own_forward(tiny_models,
                                                                                      name) -> None:
    """Bit for bit: the KV entries a chunk writes and its last row's logits do not depend on the decode
    rows and other chunks it shares a forward with."""
    model = _model(tiny_models, name)
    requests = _requests()
    engine = Engine(model, lookup=ScriptedDrafting(_plain(model, requests), "tree", 512), policy=FIXED)
    spec = SpecParams(max_draft_tokens=6)
    prompt = requests[4][0]  # 60 tokens: past the sliding fixtures' window of 12

    def prefill(others):
        """The prompt in chunks of 16, each sharing its forward with ``others`` (prefilled sequences
        stepping, and a second prompt's chunks); returns its last logits and its cache."""
        runners = [engine.start(p, params, spec) for p, params in others]
        for s in runners:
            engine.prefill(s)
        seq = engine.start(prompt, GenerationParams(max_tokens=4))
        extra = engine.start(requests[1][0], requests[1][1], spec) if others else None
        while not seq.prefill_done:
            chunks = [(seq, 16)] + ([(extra, 8)] if extra is not None and not extra.prefill_done else [])
            engine.iterate([s for s in runners if s.running], chunks)
        logits = seq.prefill_logits.clone()
        pool = engine.runner.pool
        cache = []
        for i in range(len(engine.runner.layers)):  # entry 0 holds position start (sliding layers: later)
            entries = len(prompt) - pool.start(seq.slot, i)
            cache.append((pool.keys(i)[seq.slot, :, :entries].clone(),
                          pool.values(i)[seq.slot, :, :entries].clone()))
        for s in [*runners, seq, *([extra] if extra is not None else [])]:
            engine.release(s)
        return logits, cache

    alone_logits, alone_cache = prefill([])
    shared_logits, shared_cache = prefill(requests[:3])
    assert torch.equal(alone_logits, shared_logits)
    for (k0, v0), (k1, v1) in zip(alone_cache, shared_cache, strict=True):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


def test_plain_and_speculative_sequences_share_a_step(tiny_models) -> None:
    model = _model(tiny_models, "tiny-qwen2")
    requests = _requests()
    plain = _plain(model, requests)
    engine = Engine(model, lookup=ScriptedDrafting(plain, "tree", 512), policy=FIXED)
    seqs = [engine.start(p, params, SpecParams(enabled=i % 2 == 0, max_draft_tokens=6))
            for i, (p, params) in enumerate(requests)]
    toks = {s.prompt: list(engine.prefill(s).tokens) for s in seqs}
    drafted = 0
    while any(s.running for s in seqs):
        run = [s for s in seqs if s.running]
        for s, o in zip(run, engine.step(run), strict=True):
            toks[s.prompt].extend(o.tokens)
            drafted += o.draft_tokens
            assert o.draft_tokens == 0 or s.spec.enabled
    assert drafted > 0
    assert toks == plain


def test_a_budgeted_pool_sizes_sliding_layers_for_one_forward_and_keeps_every_token(tiny_models) -> None:
    """tiny-gemma3 (three sliding layers of W = 12, one full): with ``kv_cache_bytes`` and chunked
    prefill the sliding layers' slots hold W - 1 plus the most rows a forward gives a slot (two chunks,
    or a 256-node draft tree and its root: 257, 320 entries in multiples of 64), the full layer takes
    the rest of the budget, and batched, chunked, speculative decoding still gives every request its
    plain tokens without the pool ever growing."""
    model = _model(tiny_models, "tiny-gemma3")
    requests = _requests()
    plain = _plain(model, requests)
    per_position = 2 * 2 * 16 * 4  # (k, v) x kv heads x head dim x float32, one layer
    budget = 5 * 4 * 512 * per_position  # five slots of 512 positions, every layer counted at full length
    engine = Engine(model, EngineConfig(max_batch=5, kv_cache_bytes=budget, prefill_chunk=8),
                    lookup=ScriptedDrafting(plain, "tree", 512), policy=FIXED)
    pool = engine.runner.pool
    assert pool.max_rows == 257 and pool.slot_positions == (4 * 512 - 3 * 320) // 64 * 64  # 1,088
    assert sorted(g.capacity for g in pool.groups) == [320, pool.slot_positions] and pool.nbytes <= budget
    generation = pool.generation
    spec = SpecParams(max_draft_tokens=6)
    assert _batched(engine, requests, spec, chunk=8, stagger=3, shared=True) == plain
    assert pool.generation == generation and pool.in_use() == 0


def test_a_sequence_whose_slot_cannot_grow_ends_alone_with_length(tiny_models) -> None:
    model = _model(tiny_models, "tiny-llama")
    requests = _requests()
    plain = _plain(model, requests)
    per_position = 2 * 2 * 2 * 16 * 4  # layers x (k, v) x kv heads x head dim x float32
    engine = Engine(model, EngineConfig(max_batch=2, kv_cache_bytes=2 * 128 * per_position),
                    lookup=ScriptedDrafting(plain, "none", 512))  # two slots of 128 positions
    pool = engine.runner.pool
    assert (pool.slots, pool.group(0).capacity) == (2, 128)  # reserved at once
    generation = pool.generation
    long_prompt = torch.randint(3, 512, (100,)).tolist()
    small, params = requests[0]
    a = engine.start(long_prompt, GenerationParams(max_tokens=60, ignore_eos=True),  # fits at first only
                     SpecParams(enabled=False))
    b = engine.start(small, params, SpecParams(enabled=False))
    out_a = list(engine.prefill(a).tokens)
    out_b = list(engine.prefill(b).tokens)
    with pytest.raises(Exception, match="slots are in use"):
        engine.start(small, params)
    while a.running or b.running:
        run = [s for s in (a, b) if s.running]
        for s, o in zip(run, engine.step(run), strict=True):
            (out_a if s is a else out_b).extend(o.tokens)
    assert a.finish_reason == "length" and len(out_a) < 60  # ended early: its slot could not grow
    assert out_b == plain[tuple(small)] and b.finish_reason is not None
    assert pool.in_use() == 0 and pool.generation == generation  # and never reallocated


def test_a_prompt_that_leaves_no_room_for_a_draft_still_starts_and_ends_with_length(tiny_models) -> None:
    """A slot's share of 128 positions and a 120-token prompt: no room for the prompt and a 32-node
    draft, but room for the prompt and a token. The sequence starts, decodes its plain tokens while
    they fit, and ends with "length"."""
    model = _model(tiny_models, "tiny-llama")
    prompt = torch.randint(3, 512, (120,), generator=torch.Generator().manual_seed(5)).tolist()
    params = GenerationParams(max_tokens=40, ignore_eos=True)
    plain = _plain(model, [(prompt, params)])[tuple(prompt)]
    per_position = 2 * 2 * 2 * 16 * 4  # layers x (k, v) x kv heads x head dim x float32
    engine = Engine(model, EngineConfig(max_batch=2, kv_cache_bytes=2 * 128 * per_position),
                    lookup=ScriptedDrafting({tuple(prompt): plain}, "chain", 512))
    assert engine.runner.pool.slot_positions == 128
    steps = list(engine.generate(prompt, params, spec=SpecParams(max_draft_tokens=32)))
    got = [t for s in steps for t in s.tokens]
    assert steps[-1].finish_reason == "length" and 0 < len(got) < 40
    assert got == plain[:len(got)]


@pytest.mark.real_model
def test_batched_steps_on_smollm2_equal_batch_of_one(real_text_engine) -> None:
    te = real_text_engine
    engine = te.engine
    assert engine.runner.batch_invariant
    texts = ["Summarize: The json module encodes Python objects as JSON text and decodes JSON text "
             "into Python objects. It offers dump, dumps, load and loads.",
             "Write a haiku about autumn leaves.",
             "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
             "Rewrite fib with a loop.",
             ]
    requests = []
    for i, text in enumerate(texts):
        sampling = GREEDY if i % 2 == 0 else SamplingParams(temperature=0.8, seed=100 + i)
        requests.append((te.encode_prompt(messages=[{"role": "user", "content": text}]),
                         te.params(max_tokens=24, temperature=sampling.temperature, seed=sampling.seed)))
    spec = SpecParams(enabled=False)  # plain decoding: every token depends only on the forward's rows
    alone = {tuple(p): [t for s in engine.generate(p, params, spec=spec) for t in s.tokens]
             for p, params in requests}
    assert _batched(engine, requests, spec) == alone
    assert _batched(engine, requests, spec, chunk=16, stagger=2) == alone
    assert _batched(engine, requests, spec, chunk=16, stagger=2, shared=True) == alone


def test_prefilling_a_whole_long_prompt_goes_in_the_engines_chunks(tiny_models) -> None:
    """``Engine.prefill(seq)`` on a 400-token prompt, on a budgeted engine with chunked prefill whose
    sliding layers (tiny-gemma3, W = 12) hold 320 entries a slot: it prefills in ``prefill_chunk``
    pieces (one 400-row forward would not fit them), and the sequence decodes what ``generate`` gives."""
    model = _model(tiny_models, "tiny-gemma3")
    prompt = torch.randint(3, 512, (400,), generator=torch.Generator().manual_seed(7)).tolist()
    params = GenerationParams(max_tokens=6, ignore_eos=True)
    per_position = 2 * 2 * 16 * 4  # (k, v) x kv heads x head dim x float32, one layer
    engine = Engine(model, EngineConfig(max_batch=2, kv_cache_bytes=2 * 4 * 1024 * per_position,
                                        prefill_chunk=8))
    assert engine.runner.pool.max_rows == 257
    plain = SpecParams(enabled=False)
    want = [t for s in engine.generate(prompt, params, spec=plain) for t in s.tokens]
    seq = engine.start(prompt, params, plain)
    first = engine.prefill(seq)
    assert first is not None and seq.prefill_done
    got = list(first.tokens)
    while seq.running:
        got.extend(engine.step([seq])[0].tokens)
    engine.release(seq)
    assert len(want) == 6 and got == want
