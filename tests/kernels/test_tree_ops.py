"""Tree attention masks and KV-cache compaction: Triton kernels against their twins, the twins against
plain Python, and both on a real (tiny, random) Llama: a tree forward equals one forward per path,
and after compaction the cache continues exactly as if only the accepted path had been run."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from lookupspec.kernels import (
    compact_cache,
    compact_triton,
    mask_triton,
    pack_requests,
    reference,
    tree_mask,
    verify_batch,
)

from lookupspec.hf_compat import with_cache
from lookupspec.sampling import SamplingParams
from lookupspec.tiny import FIXTURES


def random_parents(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.tensor([int(torch.randint(-1, i, (1,), generator=gen)) if i else -1 for i in range(n)])


def naive_mask(parents: list[int], prefix: int) -> tuple[list[list[bool]], list[int]]:
    visible, positions = [], []
    for i in range(len(parents)):
        anc, cur = {i}, parents[i]
        while cur >= 0:
            anc.add(cur)
            cur = parents[cur]
        visible.append([True] * prefix + [j in anc for j in range(len(parents))])
        positions.append(prefix + len(anc) - 1)
    return visible, positions


def test_mask_worked_example():
    mask, pos = reference.tree_mask(torch.tensor([-1, 0, 0]), 2, torch.float32)
    m = torch.finfo(torch.float32).min
    assert mask.shape == (1, 1, 3, 5)
    assert mask[0, 0].tolist() == [[0, 0, 0, m, m], [0, 0, 0, 0, m], [0, 0, 0, m, 0]]
    assert pos.tolist() == [[2, 3, 3]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("n", "prefix"), [(1, 0), (7, 5), (33, 70), (12, 0)])
def test_tree_mask_kernel_matches_twin_and_python(n: int, prefix: int, dtype: torch.dtype,
                                                  gen: torch.Generator, device: torch.device):
    parents = random_parents(n, gen) if n != 12 else torch.full((n,), -1)  # 12: a depth-1 tree
    mask, pos = reference.tree_mask(parents, prefix, dtype)
    kmask, kpos = (x.cpu() for x in mask_triton.tree_mask(parents.to(device), prefix, dtype))
    assert torch.equal(mask, kmask) and torch.equal(pos, kpos), f"seed {gen.initial_seed()}"
    visible, positions = naive_mask(parents.tolist(), prefix)
    assert mask.dtype == dtype and mask.shape == (1, 1, n, prefix + n)
    assert torch.equal(mask[0, 0] == 0, torch.tensor(visible))
    assert bool((mask[0, 0][~torch.tensor(visible)] == torch.finfo(dtype).min).all())
    assert pos[0].tolist() == positions


def random_paths(batch: int, max_nodes: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Increasing node indices (a root-to-node path) per row, -1 padded; some rows empty."""
    accepted = torch.full((batch, max_nodes), -1)
    num = torch.zeros(batch, dtype=torch.int64)
    for b in range(batch):
        a = int(torch.randint(0, max_nodes + 1, (1,), generator=gen))
        picks = torch.sort(torch.randperm(max_nodes, generator=gen)[:a]).values
        accepted[b, :a] = picks
        num[b] = a
    return accepted, num


@pytest.mark.parametrize("base_kind", ["int", "tensor"])
def test_compaction_kernel_matches_twin_and_python(base_kind: str, gen: torch.Generator,
                                                   device: torch.device):
    b, h, s, d, m = 4, 3, 40, 24, 9
    kv = torch.randn(b, h, s, d, generator=gen)
    accepted, num = random_paths(b, m, gen)
    accepted[0, :3] = torch.arange(3)  # an accepted chain prefix: nothing moves
    num[0] = 3
    base = 20 if base_kind == "int" else torch.tensor([5, 20, 31, 0])
    expected = kv.clone()
    for i in range(b):
        start = base if isinstance(base, int) else int(base[i])
        for j in range(int(num[i])):
            expected[i, :, start + j] = kv[i, :, start + int(accepted[i, j])]
    twin, fused = kv.clone(), kv.clone().to(device)
    reference.compact_kv(twin, accepted, num, base)
    dbase = base if isinstance(base, int) else base.to(device)
    compact_triton.compact_kv(fused, accepted.to(device), num.to(device), dbase)
    assert torch.equal(twin, expected), f"seed {gen.initial_seed()}"
    assert torch.equal(fused.cpu(), expected), f"seed {gen.initial_seed()}"


def test_compaction_at_the_end_of_the_cache(gen: torch.Generator, device: torch.device):
    """Destinations near the cache's end (the twin clamps out-of-range slots without clobbering)."""
    kv = torch.randn(2, 1, 10, 8, dtype=torch.bfloat16, generator=gen)
    accepted = torch.tensor([[1, 3, -1, -1, -1], [0, 2, 4, -1, -1]])
    num = torch.tensor([2, 3])
    base = torch.tensor([5, 5])
    twin, fused = kv.clone(), kv.clone().to(device)
    reference.compact_kv(twin, accepted, num, base)
    compact_triton.compact_kv(fused, accepted.to(device), num.to(device), base.to(device))
    assert torch.equal(twin, fused.cpu())
    assert torch.equal(twin[0, :, 5:7], kv[0, :, [6, 8]])
    assert torch.equal(twin[1, :, 5:8], kv[1, :, [5, 7, 9]])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_tree_step_on_a_tiny_llama(backend: str, gen: torch.Generator, device: torch.device):
    transformers = pytest.importorskip("transformers")

    config = transformers.AutoConfig.from_pretrained(str(FIXTURES / "models" / "tiny-llama"))
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device).eval()
    vocab = config.vocab_size

    def last_logits(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids], device=device)).logits[0, -1]

    prefix = torch.randint(vocab, (6,), generator=gen).tolist()
    root = int(torch.randint(vocab, (1,), generator=gen))
    parents = random_parents(8, gen).tolist()
    tokens = torch.randint(vocab, (8,), generator=gen).tolist()
    cache = transformers.DynamicCache(config=config)
    with torch.no_grad():
        model(input_ids=torch.tensor([prefix], device=device), **with_cache(model, cache))
        fwd_parents = torch.tensor([-1] + [p + 1 for p in parents], device=device)
        mask, pos = tree_mask(fwd_parents, len(prefix), torch.float32, backend=backend)
        out = model(input_ids=torch.tensor([[root, *tokens]], device=device), attention_mask=mask,
                    position_ids=pos, **with_cache(model, cache)).logits[0]

    def path(i: int) -> list[int]:
        nodes = []
        while i >= 0:
            nodes.append(i)
            i = parents[i]
        return nodes[::-1]

    torch.testing.assert_close(out[0], last_logits([*prefix, root]), atol=1e-4, rtol=1e-4)
    for i in range(len(tokens)):
        expect = last_logits([*prefix, root] + [tokens[j] for j in path(i)])
        torch.testing.assert_close(out[i + 1], expect, atol=1e-4, rtol=1e-4)

    # accept the path to the deepest node, compact, crop, and continue by one token
    keep = path(max(range(len(tokens)), key=lambda i: len(path(i))))
    accepted = torch.tensor([keep + [-1] * (len(tokens) - len(keep))], device=device)
    base = len(prefix) + 1  # cache slot of draft node 0 (the root sits at len(prefix))
    compact_cache(cache, accepted, torch.tensor([len(keep)], device=device), base, backend=backend)
    cache.crop(-(len(tokens) - len(keep)))  # transformers 5: a negative count of tokens to drop
    nxt = int(torch.randint(vocab, (1,), generator=gen))
    with torch.no_grad():
        cont = model(input_ids=torch.tensor([[nxt]], device=device), **with_cache(model, cache),
                     position_ids=torch.tensor([[base + len(keep)]], device=device)).logits[0, -1]
    expect = last_logits([*prefix, root] + [tokens[j] for j in keep] + [nxt])
    torch.testing.assert_close(cont, expect, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_speculative_greedy_loop_equals_plain_greedy(backend: str, gen: torch.Generator,
                                                     device: torch.device):
    """The step recipe of kernels/dispatch.py's docstring (tree mask, one forward, verify_batch,
    compact_cache, crop), run as a decode loop on a tiny Llama, emits exactly plain greedy decoding."""
    transformers = pytest.importorskip("transformers")

    config = transformers.AutoConfig.from_pretrained(str(FIXTURES / "models" / "tiny-llama"))
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device).eval()
    prompt = torch.randint(config.vocab_size, (5,), generator=gen).tolist()
    new = 10 if backend == "torch" else 6
    with torch.no_grad():
        plain: list[int] = []  # plain greedy: argmax of a full forward, token by token
        for _ in range(new):
            ids = torch.tensor([prompt + plain], device=device)
            plain.append(int(model(input_ids=ids).logits[0, -1].argmax()))
        cache = transformers.DynamicCache(config=config)
        model(input_ids=torch.tensor([prompt[:-1]], device=device), **with_cache(model, cache))
        out: list[int] = []
        root, p_len = prompt[-1], len(prompt) - 1  # the root is not in the cache yet
        while len(out) < new:
            tokens: list[int] = []
            parents: list[int] = []
            paths: list[list[int]] = []
            for i in range(int(torch.randint(0, 7, (1,), generator=gen))):
                par = int(torch.randint(-1, i, (1,), generator=gen)) if i else -1
                prefix = [] if par < 0 else paths[par]
                j = len(out) + len(prefix)
                on_track = j < new and out + prefix == plain[:j]
                tok = plain[j] if on_track and bool(torch.rand(1, generator=gen) < 0.7) else int(
                    torch.randint(config.vocab_size, (1,), generator=gen))
                tokens.append(tok)
                parents.append(par)
                paths.append([*prefix, tok])
            fwd_parents = torch.tensor([-1] + [p + 1 for p in parents], device=device)
            mask, pos = tree_mask(fwd_parents, p_len, torch.float32, backend=backend)
            logits = model(input_ids=torch.tensor([[root, *tokens]], device=device), attention_mask=mask,
                           position_ids=pos, **with_cache(model, cache)).logits[0]
            batch = pack_requests([(tokens, parents)], [SamplingParams()], [p_len], device=device)
            res = verify_batch(logits, **batch._asdict(), mode="greedy", backend=backend)
            compact_cache(cache, res.accepted, res.num_accepted, p_len + 1, backend=backend)
            step = res.results()[0]
            cache.crop(-(len(tokens) - step.num_accepted))
            emitted = step.emitted(tokens)
            out += emitted
            root, p_len = emitted[-1], p_len + len(emitted)  # the accepted drafts are in the cache now
    assert out[:new] == plain, f"seed {gen.initial_seed()}"
