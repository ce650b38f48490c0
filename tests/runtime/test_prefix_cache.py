"""The prefix cache: a prompt that starts with cached blocks gets exactly the logits and tokens of a
prefill from scratch (every tiny family, sliding windows included, greedy and seeded; SmolLM2; blocks
smaller than the chunk where chunks are free), reuse stays inside its namespace, memory stays within
the budget (least recently used leaves go first), and a lookup probes one entry per block whatever the
cache holds."""

from __future__ import annotations

import pytest
import torch

from lookupspec.config import EngineConfig
from lookupspec.engine import Engine
from lookupspec.params import GenerationParams, SpecParams
from lookupspec.runtime import pack_linears, packing_available
from lookupspec.runtime.kvpool import LayerSpec, SlotPool
from lookupspec.runtime.prefix_cache import PrefixCache
from lookupspec.sampling import SamplingParams
from lookupspec.tiny import TINY_MODELS

CHUNK = 16


def _prompts(shared: int = 53, tails=(17, 9)):
    gen = torch.Generator().manual_seed(11)
    head = torch.randint(3, 512, (shared,), generator=gen).tolist()
    return head, [head + torch.randint(3, 512, (n,), generator=gen).tolist() for n in tails]


def _run(engine, prompt, params, namespace):
    seq = engine.start(prompt, params, SpecParams(max_draft_tokens=4), namespace=namespace)
    cached = seq.prefilled
    first = None
    while first is None:
        first = engine.prefill(seq, CHUNK)
    logits = seq.prefill_logits.clone()
    tokens = list(first.tokens)
    while seq.running:
        tokens.extend(engine.step([seq])[0].tokens)
    return tokens, logits, cached


def _engines(path):
    """An engine with a prefix cache and one without, on the same (packed) tiny model."""
    from lookupspec.models import load_model

    model = load_model(str(path)).model
    if packing_available():
        pack_linears(model)
    return (Engine(model, EngineConfig(prefill_chunk=CHUNK, prefix_cache_bytes=64 << 20)),
            Engine(model, EngineConfig(prefill_chunk=CHUNK)))


@pytest.mark.parametrize("name", TINY_MODELS)
def test_a_cached_prefix_gives_exactly_the_scratch_prefill(tiny_models, name) -> None:
    cached, scratch = _engines(tiny_models[name])
    _, (a, b) = _prompts()
    for sampling in (SamplingParams(), SamplingParams(temperature=0.9, seed=5)):
        params = GenerationParams(max_tokens=24, sampling=sampling)
        _run(cached, a, params, "ns")  # stores a's whole chunks
        got, got_logits, reused = _run(cached, b, params, "ns")
        want, want_logits, none = _run(scratch, b, params, "ns")
        assert reused == 48 and none == 0  # 3 chunks of 16 shared (53 tokens in common)
        assert torch.equal(got_logits, want_logits)
        assert got == want
    st = cached.prefix_cache.stats
    assert st.hits >= 2 and st.hit_tokens >= 96 and st.bytes <= 64 << 20


@pytest.mark.parametrize("name", TINY_MODELS)
def test_blocks_prefilled_in_uneven_chunks_are_kept_only_where_the_forward_is_chunk_invariant(
        tiny_models, name) -> None:
    """A prompt prefilled in chunks that straddle the block edges (as the scheduler sizes them under
    load) keeps every block it completes where the engine's chunks are free (a chunk-invariant forward,
    windows of at least a block), and a later prompt loading them gets exactly the scratch prefill's
    logits and tokens. Elsewhere (soft-capped attention, windows shorter than a block) nothing is kept."""
    cached, scratch = _engines(tiny_models[name])
    _, (a, b) = _prompts()
    params = GenerationParams(max_tokens=12)
    seq = cached.start(a, params, SpecParams(max_draft_tokens=4), namespace="ns")
    for size in (5, 20, 9, 100):  # edges at 16, 32, 48 fall inside the chunks
        if cached.prefill(seq, size) is not None:
            break
    cached.release(seq)
    got, got_logits, reused = _run(cached, b, params, "ns")
    want, want_logits, _ = _run(scratch, b, params, "ns")
    assert got == want and torch.equal(got_logits, want_logits)
    if cached.free_chunks:
        assert cached.prefix_cache.stats.stored >= 3 and reused == 48
    else:
        assert reused == 0
        assert not cached.runner.chunk_invariant or any(s.window and s.window < CHUNK
                                                        for s in cached.runner.layers)


@pytest.mark.parametrize("name", TINY_MODELS)
def test_blocks_smaller_than_the_chunk_share_shorter_heads_where_chunks_are_free(tiny_models, name) -> None:
    """Where chunks are free, blocks of 5 tokens under chunks of 16 let a prompt reuse 50 of the 53
    tokens it shares with another (whole chunks: 48), with exactly the scratch prefill's logits and
    tokens; a block that is not a whole chunk is refused where chunks are fixed, and by default the
    block is :data:`PREFIX_BLOCK` tokens or the chunk, whichever is smaller."""
    from lookupspec.engine import PREFIX_BLOCK
    from lookupspec.models import load_model

    model = load_model(str(tiny_models[name])).model
    if packing_available():
        pack_linears(model)
    scratch = Engine(model, EngineConfig(prefill_chunk=CHUNK))
    assert Engine(model, EngineConfig(prefill_chunk=CHUNK)).prefix_block_size == min(CHUNK, PREFIX_BLOCK)
    assert (Engine(model, EngineConfig(prefill_chunk=64)).prefix_block_size
            == (PREFIX_BLOCK if scratch.free_chunks else 64))
    with pytest.raises(ValueError, match="prefix_block_size"):
        Engine(model, EngineConfig(prefill_chunk=CHUNK, prefix_block_size=CHUNK + 1))
    if not scratch.free_chunks:
        with pytest.raises(ValueError, match="chunk-invariant"):
            Engine(model, EngineConfig(prefill_chunk=CHUNK, prefix_block_size=5))
        return
    cached = Engine(model, EngineConfig(prefill_chunk=CHUNK, prefix_cache_bytes=64 << 20,
                                        prefix_block_size=5))
    _, (a, b) = _prompts()
    for expect, sampling in ((50, SamplingParams()), (60, SamplingParams(temperature=0.9, seed=5))):
        params = GenerationParams(max_tokens=24, sampling=sampling)
        _run(cached, a, params, "ns")
        got, got_logits, reused = _run(cached, b, params, "ns")
        want, want_logits, _ = _run(scratch, b, params, "ns")
        assert reused == expect  # 10 blocks of 5 shared with a (53 tokens in common), then b's own 12
        assert torch.equal(got_logits, want_logits)
        assert got == want


def test_reuse_stays_inside_its_namespace(tiny_models) -> None:
    from lookupspec.models import load_model

    engine = Engine(load_model(str(tiny_models["tiny-llama"])).model,
                    EngineConfig(prefill_chunk=CHUNK, prefix_cache_bytes=64 << 20))
    _, (a, b) = _prompts()
    params = GenerationParams(max_tokens=4)
    _run(engine, a, params, "alpha")
    assert _run(engine, b, params, "beta")[2] == 0  # another namespace's chunks are never found
    assert _run(engine, b, params, None)[2] == 0  # nor by a request outside the cache
    assert _run(engine, b, params, "alpha")[2] == 48


def _pool():
    return SlotPool([LayerSpec(1, 4, 4), LayerSpec(1, 4, 4, window=6)], dtype=torch.float32, max_batch=4,
                    max_positions=512, initial_capacity=64, align=8)


def _fill(pool, slot, n, value):
    pool.ensure(slot, n)
    with torch.inference_mode():
        for g in pool.groups:
            for t in g.tensors:
                t[:, slot, :, :n] = value
    pool.advance(slot, n)


def test_memory_stays_within_the_budget_least_recently_used_leaves_first() -> None:
    pool = _pool()
    per_block = 2 * 2 * 1 * 8 * 4 * 4  # 2 groups x (k, v) x 1 head x 8 positions x 4 dims x float32
    cache = PrefixCache(pool, block=8, max_bytes=5 * per_block)
    slot = pool.allocate(64)
    chains = {}
    for name, first in (("a", 1), ("b", 2), ("c", 3)):
        pool.truncate(slot, 0)
        _fill(pool, slot, 16, float(first))
        parent = cache.store("ns", None, [first] * 8, slot, 0)
        chains[name] = cache.store("ns", parent, [first + 10] * 8, slot, 8)
    assert cache.stats.bytes <= 5 * per_block and cache.stats.evicted == 1
    # chain a was stored first: its leaf went; its first block is still there, and now the oldest leaf
    assert [len(cache.lookup("ns", [t] * 8 + [t + 10] * 8 + [0])) for t in (1, 2, 3)] == [1, 2, 2]
    assert cache.lookup("ns", [1] * 8 + [0]) and cache.stats.blocks == 5


def test_an_evicted_block_lends_its_buffers_to_the_next_chunk_stored() -> None:
    """A full cache stores a chunk per eviction: the chunk goes into the evicted block's buffers (no
    fresh memory to fault in), holds its own entries, and loads them back."""
    pool = _pool()
    per_block = 2 * 2 * 1 * 8 * 4 * 4
    cache = PrefixCache(pool, block=8, max_bytes=2 * per_block)
    slot = pool.allocate(64)
    blocks, pointers = [], []
    for value in (1.0, 2.0, 3.0):
        pool.truncate(slot, 0)
        _fill(pool, slot, 8, value)
        blocks.append(cache.store("ns", None, [int(value)] * 8, slot, 0))
        pointers.append({t.data_ptr() for g in blocks[-1].data for t in g})
    first, third = blocks[0], blocks[2]
    assert cache.stats.evicted == 1 and first.data == []  # out of the cache, its buffers lent
    assert pointers[2] == pointers[0] and pointers[1].isdisjoint(pointers[0])
    assert cache.lookup("ns", [1] * 9) == [] and cache.lookup("ns", [3] * 9) == [third]
    pool.truncate(slot, 0)
    _fill(pool, slot, 8, 4.0)  # the slot's entries change; the block keeps its copy
    other = pool.allocate(64)
    assert cache.load(other, [third]) == 8
    for g in pool.groups:
        for t in g.tensors:
            assert torch.equal(t[:, other, :, :8], torch.full_like(t[:, other, :, :8], 3.0))
    # the next eviction lends the oldest block's buffers again; a clear() keeps none
    pool.truncate(slot, 0)
    _fill(pool, slot, 8, 5.0)
    fifth = cache.store("ns", None, [5] * 8, slot, 0)
    assert {t.data_ptr() for g in fifth.data for t in g} == pointers[1]  # the second block's
    cache.clear()
    assert cache._spare == [] and cache.stats.bytes == 0


def test_a_lookup_probes_one_entry_per_chunk_whatever_the_cache_holds() -> None:
    pool = _pool()
    cache = PrefixCache(pool, block=8, max_bytes=1 << 30)
    slot = pool.allocate(64)
    _fill(pool, slot, 8, 0.0)
    for i in range(2000):  # many unrelated prompts
        cache.store("ns", None, [i, i + 1, 0, 0, 0, 0, 0, 0], slot, 0)

    class Counting(dict):
        probes = 0

        def get(self, key, default=None):
            Counting.probes += 1
            return super().get(key, default)

    cache._blocks = Counting(cache._blocks)
    cache.lookup("ns", [7] * 80)
    assert Counting.probes == 1  # a miss at the first chunk
    cache.lookup("ns", [5, 6, 0, 0, 0, 0, 0, 0] + [9] * 72)
    assert Counting.probes == 1 + 2  # a hit, then a miss at the second chunk


@pytest.mark.real_model
def test_a_cached_prefix_is_exact_on_smollm2(real_text_engine) -> None:
    te = real_text_engine
    system = "You answer questions using only the passages below.\n\n" + "Passage: " + (
        "The with statement wraps a block in the methods of a context manager. " * 12)
    ask = [te.encode_prompt(messages=[{"role": "system", "content": system}, {"role": "user", "content": q}])
           for q in ("What does with do?", "Which methods does a context manager define?")]
    model = te.engine.model
    cached = Engine(model, EngineConfig(prefill_chunk=64, prefix_cache_bytes=256 << 20))
    scratch = Engine(model, EngineConfig(prefill_chunk=64))
    for sampling in (SamplingParams(), SamplingParams(temperature=0.8, seed=3)):
        params = GenerationParams(max_tokens=32, sampling=sampling)
        list(cached.generate(ask[0], params, namespace="rag"))
        got = [t for s in cached.generate(ask[1], params, namespace="rag") for t in s.tokens]
        want = [t for s in scratch.generate(ask[1], params) for t in s.tokens]
        assert got == want
    assert cached.prefix_cache.stats.hit_tokens >= 2 * 64 * 2
