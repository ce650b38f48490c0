"""The fused verification kernel against its torch twin (exact: paths, counts, tokens), and the twin
against lookupspec/verify.py request by request.

On a machine without CUDA the kernel runs in the Triton interpreter, on small shapes (vocabularies
that are not a multiple of the block, several blocks per row); inputs are drawn fresh every run
(the generator seed is in every failure message) plus hand-made adversarial cases. The CUDA test at
the end repeats the comparison on large shapes and is skipped without a GPU.

Exactness caveat, interpreter only: the kernel's logs are numpy's, the twin's torch's, which differ
by one ulp on some inputs; a sampled token can differ only where the two best perturbed scores are
within an ulp (probability about 1e-7 per sampled row, i.e. about 1e-4 per run of this file).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("triton")

from lookupspec.kernels import RequestBatch, pack_requests, reference
from lookupspec.kernels import verify_triton as fused
from verify_oracle import oracle_verify_rejection, oracle_verify_tree

from lookupspec.sampling import SamplingParams, gumbel_noise, select_tokens
from lookupspec.verify import node_depths, target_probs

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
GREEDY = SamplingParams()
MIXED = [
    SamplingParams(temperature=0.8, seed=1),
    GREEDY,
    SamplingParams(temperature=1.2, top_k=7, seed=2),
    SamplingParams(temperature=0.7, top_p=0.8, seed=3),
    SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=4),
    SamplingParams(temperature=0.01, seed=5),
]


@dataclass
class Case:
    logits: torch.Tensor  # [rows, vocab]
    batch: RequestBatch
    trees: list[tuple[list[int], list[int]]]
    params: list[SamplingParams]
    roots: list[int]
    draft_probs: torch.Tensor | None = None


def _parents(n: int, shape: str, gen: torch.Generator) -> list[int]:
    if shape == "chain":
        return list(range(-1, n - 1))
    if shape == "wide":
        return [-1] * n
    if shape == "bushy":  # a few root children, every other node under one of them
        return [-1 if i < 3 else int(torch.randint(0, 3, (1,), generator=gen)) for i in range(n)]
    return [int(torch.randint(-1, i, (1,), generator=gen)) if i else -1 for i in range(n)]


def _with_seed(p: SamplingParams, gen: torch.Generator) -> SamplingParams:
    if p.greedy:
        return p
    return SamplingParams(p.temperature, p.top_k, p.top_p, int(torch.randint(0, 2**62, (1,), generator=gen)))


def make_case(
    gen: torch.Generator,
    device: torch.device,
    sizes: list[int],
    vocab: int,
    dtype: torch.dtype,
    params: list[SamplingParams],
    shape: str = "random",
    match_rate: float = 0.6,
    scale: float = 3.0,
    draft: str | None = None,  # rejection: "random" | "identical" | "one_hot" | "disjoint" | "mixed"
) -> Case:
    """Random trees whose nodes copy their parent row's target token with probability match_rate
    (rejection: sampled chains with draft probabilities of the given kind)."""
    params = [_with_seed(params[b % len(params)], gen) for b in range(len(sizes))]
    roots = [int(torch.randint(0, 5000, (1,), generator=gen)) for _ in sizes]
    logits = (torch.randn(sum(sizes) + len(sizes), vocab, generator=gen) * scale).to(dtype)
    trees, qs, row = [], [], 0
    for b, n in enumerate(sizes):
        rows = logits[row : row + n + 1]
        parents = _parents(n, "chain" if draft else shape, gen)
        if draft is None:
            depth = torch.cat([torch.zeros(1, dtype=torch.int64), node_depths(parents)])
            want = select_tokens(rows, params[b], roots[b] + 1 + depth).tolist()
            tokens = [
                want[p + 1] if bool(torch.rand(1, generator=gen) < match_rate)
                else int(torch.randint(vocab, (1,), generator=gen))
                for p in parents
            ]
        else:
            kinds = ["random", "identical", "one_hot", "disjoint"] if draft == "mixed" else [draft]
            probs = target_probs(rows.float(), params[b])
            tokens = []
            for i in range(n):
                kind = kinds[(b + i) % len(kinds)]
                q = torch.softmax(torch.randn(vocab, generator=gen) * 2, 0)
                if kind == "identical":
                    q = probs[i].clone()
                elif kind == "one_hot":
                    q = torch.zeros(vocab)
                    q[int(torch.randint(vocab, (1,), generator=gen))] = 1.0
                elif kind == "disjoint":
                    q = torch.where(probs[i] > 0, 0.0, q)
                    q = q / q.sum() if bool(q.sum() > 0) else torch.full((vocab,), 1.0 / vocab)
                qs.append(q)
                tokens.append(int(torch.multinomial(q, 1, generator=gen)))
        trees.append((tokens, parents))
        row += n + 1
    batch = pack_requests(trees, params, roots, device=device)
    q_all = torch.stack(qs) if qs else (torch.zeros(0, vocab) if draft else None)
    return Case(logits.to(device), batch, trees, params, roots, None if q_all is None else q_all.to(device))


def check(case: Case, mode: str, gen: torch.Generator) -> None:
    """Kernel == twin field by field; twin == the plain per-request oracle request by request."""
    kw = case.batch._asdict()
    ref = reference.verify_batch(case.logits, **kw, mode=mode, draft_probs=case.draft_probs)
    out = fused.verify_batch(case.logits, **kw, mode=mode, draft_probs=case.draft_probs)
    where = f"seed {gen.initial_seed()}, mode {mode}, dtype {case.logits.dtype}"
    for name in ref._fields:
        a, b = getattr(ref, name), getattr(out, name)
        assert a.dtype == b.dtype and torch.equal(a, b), f"{name} differs ({where}):\n{a}\n{b}"
    off = case.batch.row_offsets.tolist()
    results = ref.results()
    for b, (tokens, parents) in enumerate(case.trees):
        rows = case.logits[off[b] : off[b + 1]]
        params = GREEDY if mode == "greedy" else case.params[b]
        if mode == "rejection":
            assert case.draft_probs is not None
            q = case.draft_probs[off[b] - b : off[b + 1] - b - 1]
            expected = oracle_verify_rejection(rows, tokens, q, params, case.roots[b])
        else:
            expected = oracle_verify_tree(rows, tokens, parents, params, case.roots[b])
        assert results[b] == expected, f"request {b} ({where}): twin {results[b]} != oracle {expected}"


# --- random batches ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_greedy_random_trees(dtype: torch.dtype, gen: torch.Generator, device: torch.device):
    case = make_case(gen, device, [0, 1, 3, 8, 17], 300, dtype, [GREEDY])
    case.logits[2, 7] = case.logits[2, 200] = case.logits[2].max() + 1  # a tie across blocks
    check(case, "greedy", gen)
    check(case, "match", gen)  # greedy parameters under the sampling mode: the same rule


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sample_and_match_random_trees(dtype: torch.dtype, gen: torch.Generator, device: torch.device):
    check(make_case(gen, device, [4, 6, 0, 3, 5, 2], 300, dtype, MIXED), "match", gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rejection_random_chains(dtype: torch.dtype, gen: torch.Generator, device: torch.device):
    check(make_case(gen, device, [3, 5, 2, 0, 4, 1], 200, dtype, MIXED, draft="mixed"), "rejection", gen)


# --- adversarial cases ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["greedy", "match"])
def test_all_accepted_and_all_rejected(mode: str, gen: torch.Generator, device: torch.device):
    params = [GREEDY] if mode == "greedy" else [SamplingParams(0.9, 5, 0.95), SamplingParams(1.1)]
    full = make_case(gen, device, [5, 7, 3], 150, torch.float32, params, shape="chain", match_rate=1.0)
    none = make_case(gen, device, [5, 7, 3], 150, torch.float32, params, shape="wide", match_rate=0.0)
    for case in (full, none):
        check(case, mode, gen)
    out = reference.verify_batch(full.logits, **full.batch._asdict(), mode=mode)
    assert out.num_accepted.tolist() == [5, 7, 3] and not out.recovered.any()


def test_rejection_identical_draft_accepts_everything(gen: torch.Generator, device: torch.device):
    params = [SamplingParams(1.0, 0, 1.0, 1), SamplingParams(0.6, 10, 0.9, 2)]
    case = make_case(gen, device, [5, 7], 120, torch.float32, params, draft="identical")
    check(case, "rejection", gen)
    out = fused.verify_batch(case.logits, **case.batch._asdict(), mode="rejection",
                             draft_probs=case.draft_probs)
    assert out.num_accepted.tolist() == [5, 7]


@pytest.mark.parametrize("mode", ["greedy", "match"])
def test_wide_and_bushy_trees(mode: str, gen: torch.Generator, device: torch.device):
    params = [GREEDY] if mode == "greedy" else MIXED[:3]
    check(make_case(gen, device, [40, 1], 100, torch.float16, params, shape="wide"), mode, gen)
    check(make_case(gen, device, [30, 12], 100, torch.float32, params, shape="bushy"), mode, gen)


@pytest.mark.parametrize("vocab", [1, 2, 127, 128, 129])
def test_vocab_at_block_edges(vocab: int, gen: torch.Generator, device: torch.device):
    check(make_case(gen, device, [3, 2], vocab, torch.float32, [GREEDY]), "greedy", gen)
    params = [SamplingParams(1.0, 3, 1.0, 1), SamplingParams(0.5, 0, 0.7, 2)]
    check(make_case(gen, device, [3, 2], vocab, torch.bfloat16, params), "match", gen)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_extreme_finite_logits(dtype: torch.dtype, gen: torch.Generator, device: torch.device):
    info = torch.finfo(dtype)
    case = make_case(gen, device, [3, 4, 2], 140, dtype, [GREEDY], scale=1.0)
    lg = case.logits
    lg[0] = info.min
    lg[0, 139] = info.max  # in the last, partial block
    lg[1, ::2] = info.max  # ties at the maximum
    lg[2] = info.tiny  # all tied: token 0
    lg[3, 5] = -info.max
    check(case, "greedy", gen)
    big = 1.0e30 if dtype != torch.float16 else 6.0e4  # x / T stays finite for T >= 1
    params = [SamplingParams(1.0, 0, 1.0, 1), SamplingParams(1.5, 3, 1.0, 2), SamplingParams(1.0, 0, 0.5, 3)]
    case = make_case(gen, device, [3, 4, 2], 140, dtype, params)
    case.logits[0, 3] = big
    case.logits[1, ::3] = -big
    case.logits[4] = -big
    case.logits[6, 10:20] = big
    check(case, "match", gen)


def test_ties_in_top_k_and_top_p(gen: torch.Generator, device: torch.device):
    params = [SamplingParams(1.0, 3, 1.0, 1), SamplingParams(1.0, 0, 0.5, 2), SamplingParams(1.0, 2, 0.3, 3)]
    case = make_case(gen, device, [3, 3, 3], 90, torch.float32, params)
    case.logits.copy_(torch.randint(0, 3, case.logits.shape, generator=gen).float())  # many exact ties
    case.logits[4] = 1.0  # a flat row: every token tied, all kept by top-p
    check(case, "match", gen)


def test_gumbel_noise_is_finite_at_the_top_bit_pattern(device: torch.device):
    """With 24-bit uniforms, (seed 1055289, position 100, token 36) hit u == 1.0 and +inf noise, so
    that token won every sample and beat top-k filtering (-inf + inf = NaN). With 23 bits the noise
    is finite there, filtered tokens are never chosen, and the kernel agrees with the twin."""
    seed, position, vocab = 1055289, 100, 48
    assert torch.isfinite(gumbel_noise(seed, torch.tensor([position]), vocab)).all()
    logits = -torch.arange(vocab, dtype=torch.float32)[None] / 10
    logits[0, 5] = 30.0  # top-2 = {5, 0}: top_k=2 filters token 36
    p = SamplingParams(1.0, 2, 1.0, seed)
    assert int(select_tokens(logits, p, torch.tensor([position]))[0]) in (0, 5)
    batch = pack_requests([([], [])], [p], [position - 1], device=device)
    outs = [impl.verify_batch(logits.to(device), **batch._asdict(), mode="match").next_token.tolist()
            for impl in (reference, fused)]
    assert outs[0] == outs[1]
    assert outs[0][0] in (0, 5)


def test_gpu_radix_width_and_small_blocks(gen: torch.Generator, device: torch.device,
                                          monkeypatch: pytest.MonkeyPatch):
    """The GPU configuration (4-bit radix digits) on interpreter-sized blocks."""
    monkeypatch.setattr(fused, "INTERPRETER_CONFIG", (64, 32, 4, 1))
    params = [SamplingParams(0.9, 9, 1.0), SamplingParams(1.1, 0, 0.85), SamplingParams(1.0, 30, 0.6)]
    check(make_case(gen, device, [1, 2, 1], 150, torch.float32, params), "match", gen)
    check(make_case(gen, device, [1, 2], 150, torch.float32, params[1:], draft="mixed"), "rejection", gen)


def test_twin_rejection_sampling_is_lossless_with_many_samples(gen: torch.Generator):
    """A high-power version of tests/test_verify.py's chi-square test, on the batched twin: 20000
    one-node chains per adversarial pair. Fails with probability 1e-6 per pair on a correct rule."""
    vocab, n = 5, 20000
    for kind in ("identical", "disjoint", "one_hot", "near_uniform"):
        logits = torch.randn(vocab, generator=gen) * (0.05 if kind == "near_uniform" else 1.0)
        q = torch.softmax(torch.randn(vocab, generator=gen) * (0.05 if kind == "near_uniform" else 1.0), 0)
        if kind == "identical":
            q = torch.softmax(logits, 0)
        elif kind == "disjoint":
            logits[3:] = -1.0e4
            q[:3] = 0.0
            q /= q.sum()
        elif kind == "one_hot":
            q = torch.nn.functional.one_hot(torch.argmax(logits), vocab).float()
        drafts = torch.multinomial(q, n, replacement=True, generator=gen)
        rows = torch.stack([logits, torch.zeros(vocab)]).repeat(n, 1)  # root row, node row
        base = int(torch.randint(0, 2**40, (1,), generator=gen))
        out = reference.verify_batch(
            rows, drafts, torch.full((n,), -1), torch.arange(0, 2 * n + 1, 2),
            torch.ones(n), torch.zeros(n, dtype=torch.int32), torch.ones(n),
            torch.arange(base, base + n), torch.full((n,), 11),
            mode="rejection", max_nodes=1, draft_probs=q.expand(n, vocab),
        )
        first = torch.where(out.num_accepted > 0, drafts, out.next_token)
        counts = torch.bincount(first, minlength=vocab)
        p = torch.softmax(logits, 0)
        assert counts[p == 0].sum() == 0, (kind, counts.tolist())
        expected = p[p > 0] * n
        stat = ((counts[p > 0] - expected) ** 2 / expected).sum()
        pvalue = float(torch.special.gammaincc(torch.tensor((expected.numel() - 1) / 2.0), stat / 2.0))
        assert pvalue > 1e-6, (kind, gen.initial_seed(), counts.tolist(), p.tolist())


# --- CUDA ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    ("batch", "nodes", "vocab", "dtype"),
    [(64, 64, 32000, torch.bfloat16), (16, 32, 128256, torch.float16), (4, 16, 256000, torch.float32)],
)
def test_cuda_large_shapes(batch: int, nodes: int, vocab: int, dtype: torch.dtype, gen: torch.Generator,
                           device: torch.device):
    sizes = [nodes - (b % 3) for b in range(batch)]
    runs = (("greedy", [GREEDY], None), ("match", MIXED, None), ("rejection", MIXED, "mixed"))
    for mode, params, draft in runs:
        if mode == "rejection" and batch * nodes * vocab > 2**28:
            sizes = sizes[:4]
        check(make_case(gen, device, sizes, vocab, dtype, params, draft=draft), mode, gen)
