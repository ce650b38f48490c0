"""The native attention kernel (``native/attention.c``): exact attention within float32 noise, and a
row's bits fixed by its own position: the same in any batch, thread count, prompt chunking or draft tree."""

from __future__ import annotations

import itertools

import pytest
import torch

from lookupspec.runtime.native import attention as native_attention
from lookupspec.runtime.native.loader import LazyLibrary

needs_kernel = pytest.mark.skipif(
    native_attention.kernel() is None,
    reason=f"the attention kernel does not build here: {native_attention.kernel_error()}")


class Pool:
    """Random keys and values as the slot pool lays them out: [slots, kv_heads, entries, d]."""

    def __init__(self, heads=9, kv_heads=3, d=64, dv=64, slots=6, entries=320, seed=0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.heads, self.kv_heads, self.d, self.dv = heads, kv_heads, d, dv
        self.k = torch.randn(slots, kv_heads, entries, d, generator=gen)
        self.v = torch.randn(slots, kv_heads, entries, dv, generator=gen)
        self.gen = gen

    def queries(self, rows: int) -> torch.Tensor:
        return torch.randn(rows, self.heads, self.d, generator=self.gen)

    def run(self, q: torch.Tensor, views: list[tuple], lib=None, threads: int | None = None,
            softcap: float = 0.0) -> torch.Tensor:
        """views: (slot, r0, r1, lo, hi, mask) with mask None (all keys), "causal" or bool [n, hi - lo]."""
        lib = lib or native_attention.kernel()
        plan, parts, offset = [], [], 0
        for slot, r0, r1, lo, hi, mask in views:
            if mask is None:
                plan.append([slot, r0, r1, lo, hi, 0, 0])
            elif isinstance(mask, str):
                plan.append([slot, r0, r1, lo, hi, 1, 0])
            else:
                plan.append([slot, r0, r1, lo, hi, 2, offset])
                parts.append(mask.to(torch.uint8).reshape(-1))
                offset += mask.numel()
        plan_t = torch.tensor(plan, dtype=torch.int64)
        masks = torch.cat(parts) if parts else torch.zeros(1, dtype=torch.uint8)
        out = torch.full((q.shape[0], self.heads, self.dv), float("nan"))
        lib.attention_ragged(q.data_ptr(), q.stride(0), q.stride(1),
                       self.k.data_ptr(), self.k.stride(0), self.k.stride(1), self.k.stride(2),
                       self.v.data_ptr(), self.v.stride(0), self.v.stride(1), self.v.stride(2),
                       self.heads, self.kv_heads, self.d, self.dv, plan_t.data_ptr(), len(plan),
                       masks.data_ptr(), self.d ** -0.5, softcap, out.data_ptr(),
                       threads or torch.get_num_threads())
        return out

    def reference(self, q: torch.Tensor, slot: int, entries: list[int], softcap: float = 0.0) -> torch.Tensor:
        """One row's attention in float64 over the given entries: [heads, dv]."""
        g = self.heads // self.kv_heads
        k = self.k[slot][:, entries].double()  # [kv, L, d]
        v = self.v[slot][:, entries].double()
        qq = q.double().view(self.kv_heads, g, self.d)
        scores = torch.einsum("kgd,kld->kgl", qq, k) * self.d ** -0.5
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        p = torch.softmax(scores, -1)
        return torch.einsum("kgl,kld->kgd", p, v).reshape(self.heads, self.dv)


def _tril(n: int, keys: int) -> torch.Tensor:
    return torch.ones(n, keys, dtype=torch.bool).tril(keys - n)


@needs_kernel
@pytest.mark.parametrize("shape", [(9, 3, 64, 64), (4, 2, 16, 16), (6, 6, 32, 48), (8, 1, 128, 128)])
def test_it_is_attention_within_float32_noise(shape) -> None:
    heads, kv, d, dv = shape
    pool = Pool(heads, kv, d, dv)
    parents = [-1, 0, 0, 1, 3, 1, -1]
    reach = torch.eye(7, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            reach[i] |= reach[p]
    tree = torch.cat([torch.ones(7, 100, dtype=torch.bool), reach], 1)  # 100 cached + 7 draft rows
    band = _tril(20, 60) & ~_tril(20, 60).tril(60 - 20 - 9)  # a sliding window of 9 keys
    # a window of 70 keys over 200: rows whose keys start past the range's first, across the kernel's
    # blocks of 64 entries
    wide = _tril(12, 200) & ~_tril(12, 200).tril(200 - 12 - 70)
    views = [(0, 0, 1, 0, 217, None),  # a decode row over 217 keys
             (1, 1, 31, 0, 30, "causal"),  # a first prompt chunk
             (2, 31, 47, 0, 80, _tril(16, 80)),  # a chunk after 64 cached positions
             (3, 47, 54, 0, 107, tree),
             (4, 54, 74, 40, 100, band),
             (5, 74, 86, 10, 210, wide)]
    q = pool.queries(86)
    out = pool.run(q, views)
    for slot, r0, r1, lo, hi, mask in views:
        for i in range(r1 - r0):
            if mask is None:
                seen = list(range(lo, hi))
            elif isinstance(mask, str):
                seen = list(range(lo, lo + i + 1))
            else:
                seen = [lo + j for j in range(hi - lo) if mask[i, j]]
            ref = pool.reference(q[r0 + i], slot, seen)
            torch.testing.assert_close(out[r0 + i].double(), ref, rtol=1e-5, atol=2e-6)


@needs_kernel
def test_soft_capped_scores_are_attention_within_float32_noise_and_keep_a_rows_bits() -> None:
    """Gemma 2's cap * tanh(score / cap) before the softmax: against float64, and a tree row against
    the same row alone."""
    pool = Pool(8, 4, 16, 16)
    q = pool.queries(21)
    views = [(0, 0, 1, 0, 150, None), (1, 1, 21, 0, 60, _tril(20, 60))]
    cap = 0.7  # scores of random 16-dim queries and keys reach past it: the cap bites
    out = pool.run(q, views, softcap=cap)
    plain = pool.run(q, views)
    assert not torch.allclose(out, plain)
    for slot, r0, r1, lo, hi, mask in views:
        for i in range(r1 - r0):
            seen = list(range(lo, hi)) if mask is None else [lo + j for j in range(hi - lo) if mask[i, j]]
            ref = pool.reference(q[r0 + i], slot, seen, softcap=cap)
            torch.testing.assert_close(out[r0 + i].double(), ref, rtol=1e-5, atol=2e-6)
    row = 13  # the same row in a one-row view over its visible keys
    alone = pool.run(q[1 + row:2 + row].contiguous(), [(1, 0, 1, 0, 60 - 20 + row + 1, None)], softcap=cap)
    assert torch.equal(alone[0], out[1 + row])


@needs_kernel
def test_a_row_does_not_depend_on_its_batch_or_the_thread_count() -> None:
    pool = Pool()
    q = pool.queries(55)
    window = _tril(15, 140) & ~_tril(15, 140).tril(140 - 15 - 50)  # 50 keys, each row's from its own first
    views = [(0, 0, 1, 0, 300, None), (1, 1, 17, 0, 116, _tril(16, 116)), (2, 17, 18, 0, 5, None),
             (3, 18, 40, 0, 22, "causal"), (4, 40, 55, 20, 160, window)]
    together = pool.run(q, views, threads=2)
    assert torch.equal(together, pool.run(q, views, threads=1))
    for slot, r0, r1, lo, hi, mask in views:
        alone = pool.run(q[r0:r1].contiguous(), [(slot, 0, r1 - r0, lo, hi, mask)])
        assert torch.equal(alone, together[r0:r1])


@needs_kernel
@pytest.mark.parametrize("shape", [(9, 3, 64, 64), (8, 2, 64, 64), (12, 2, 64, 128), (4, 4, 32, 32)])
def test_a_prompt_gets_the_same_bits_in_any_chunking(shape) -> None:
    """Chunks pair their rows and group query heads by three where they can (attention.c's AVX-512 scores
    and weighted values); a head left over (four per key), a 128-wide value and one query head per
    key take other paths: a row gets the same bits whichever."""
    pool = Pool(*shape)
    q = pool.queries(300)

    def chunks(bounds):
        rows = []
        for a, b in itertools.pairwise(bounds):
            mask = "causal" if a == 0 else _tril(b - a, b)
            rows.append(pool.run(q[a:b].contiguous(), [(0, 0, b - a, 0, b, mask)]))
        return torch.cat(rows)

    whole = chunks([0, 300])
    for bounds in ([0, 128, 256, 300], [0, 64, 100, 237, 300], [0, 1, 2, 50, 299, 300]):
        assert torch.equal(chunks(bounds), whole), bounds
    one_by_one = [pool.run(q[i:i + 1].contiguous(), [(0, 0, 1, 0, i + 1, None)]) for i in range(280, 300)]
    assert torch.equal(torch.cat(one_by_one), whole[280:])


@needs_kernel
def test_a_draft_tree_row_equals_the_same_token_decoded_after_its_ancestors() -> None:
    """Tree rows sit at entries past + i; once a path is accepted its entries move to past + depth.
    A row must get the same bits both ways: that is what makes speculation exact bit for bit."""
    pool = Pool()
    past, parents = 50, [-1, 0, 0, 2, 3, 0]
    reach = torch.eye(6, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            reach[i] |= reach[p]
    q = pool.queries(6)
    tree = pool.run(q, [(0, 0, 6, 0, past + 6, torch.cat([torch.ones(6, past, dtype=torch.bool), reach], 1))])
    for i in range(6):
        path = [j for j in range(6) if reach[i, j]]  # ancestors and itself, in entry (= depth) order
        pool.k[1, :, :past] = pool.k[0, :, :past]
        pool.v[1, :, :past] = pool.v[0, :, :past]
        for depth, j in enumerate(path):  # the accepted path, compacted
            pool.k[1, :, past + depth] = pool.k[0, :, past + j]
            pool.v[1, :, past + depth] = pool.v[0, :, past + j]
        alone = pool.run(q[i:i + 1].contiguous(), [(1, 0, 1, 0, past + len(path), None)])
        assert torch.equal(alone[0], tree[i]), f"row {i}"


@needs_kernel
def test_the_avx2_build_gives_the_same_bits() -> None:
    """Dot products, softmax and sums follow one tree of lanes in both instruction sets."""
    native = native_attention.kernel()
    avx2 = native_attention._LIBRARY.build("haswell")  # into the shared kernel cache
    assert avx2.attention_isa() == 256
    pool = Pool()
    q = pool.queries(50)
    views = [(0, 0, 1, 0, 211, None), (1, 1, 33, 0, 90, _tril(32, 90)), (2, 33, 50, 0, 17, "causal")]
    assert torch.equal(pool.run(q, views, lib=native), pool.run(q, views, lib=avx2))


def test_a_failed_build_falls_back_to_sdpa_or_fails_when_asked_for(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(native_attention, "_LIBRARY", LazyLibrary(
        native_attention._SOURCE, native_attention._declare, "LOOKUPSPEC_CPU_ATTENTION", on="native",
        off="sdpa", fallback="SDPA"))
    monkeypatch.setenv("LOOKUPSPEC_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setenv("LOOKUPSPEC_CPU_ATTENTION", "auto")
    assert native_attention.kernel() is None
    assert "false failed" in (native_attention.kernel_error() or "")
    monkeypatch.setenv("LOOKUPSPEC_CPU_ATTENTION", "native")
    with pytest.raises(RuntimeError, match="could not be built"):
        native_attention.kernel()
    monkeypatch.setenv("LOOKUPSPEC_CPU_ATTENTION", "flash")
    with pytest.raises(ValueError, match="LOOKUPSPEC_CPU_ATTENTION"):
        native_attention.kernel()


@needs_kernel
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3", "tiny-gemma2"])
def test_the_runtime_forward_agrees_with_sdpa(tiny_models, monkeypatch, name) -> None:
    """The runner's logits with the kernel and with SDPA (per sequence; Gemma 2's soft-capped scores:
    the attention written out) differ by float noise only, sliding-window layers included."""
    from lookupspec.models import load_model
    from lookupspec.runtime import ModelRunner, SeqRows

    model = load_model(str(tiny_models[name])).model
    runner = ModelRunner(model, context_window=2048)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 512, (45,), generator=gen).tolist()
    draft = torch.randint(3, 512, (6,), generator=gen).tolist()
    logits = {}
    for choice in ("sdpa", "native"):
        monkeypatch.setenv("LOOKUPSPEC_CPU_ATTENTION", choice)
        slot = runner.allocate(64)
        rows = [runner.prefill(slot, prompt[a:a + 16]) for a in range(0, 45, 16)]
        tree = runner.forward([SeqRows(slot, draft, [-1, 0, 0, 1, 3, -1])])
        logits[choice] = (rows[-1], tree)
        runner.free(slot)
    for a, b in zip(logits["sdpa"], logits["native"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gemma2"])
def test_with_both_kernels_the_forward_does_not_depend_on_the_prompt_chunking(tiny_models, name) -> None:
    """The streaming matmul gives a row its bits whatever the row count, and the kernel whatever the
    chunk: a prompt prefilled in any chunks leaves the same KV entries and the same last logits.
    (With SDPA they differ in the last bits: its blocking follows the key count.)"""
    from lookupspec.models import load_model
    from lookupspec.runtime import ModelRunner, pack_linears
    from lookupspec.runtime.native import matmul

    if matmul.kernel() is None:
        pytest.skip(f"the streaming kernel does not build here: {matmul.kernel_error()}")
    model = load_model(str(tiny_models[name])).model
    pack_linears(model)
    runner = ModelRunner(model, context_window=2048)
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, 512, (150,), generator=gen).tolist()
    seen = []
    for chunk in (128, 64, 37, 1000):
        slot = runner.allocate(160)
        last = [runner.prefill(slot, prompt[a:a + chunk]) for a in range(0, 150, chunk)][-1]
        kv = [runner.pool.keys(i)[slot, :, :150].clone() for i in range(len(runner.layers))]
        seen.append((last, kv))
        runner.free(slot)
    for last, kv in seen[1:]:
        assert torch.equal(last, seen[0][0])
        assert all(torch.equal(a, b) for a, b in zip(kv, seen[0][1], strict=True))
