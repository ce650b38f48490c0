"""The static step's attention: the Triton kernel (under the interpreter off CUDA) against its torch twin,
and the twin against SDPA with an explicit mask, per sequence, over random buckets: sequences of
different cache lengths (none too), decode rows, draft trees, causal chunks, padding rows, grouped
query heads, sliding windows (with a slot whose sliding group has dropped old entries)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lookupspec.kernels import tree_attention

from lookupspec.runtime.static.layout import tree_bits


@dataclass
class Case:
    q: torch.Tensor  # [R, H, D]
    k: torch.Tensor  # [R, KV, D]
    v: torch.Tensor
    kc: torch.Tensor  # [slots, KV, cap, D]
    vc: torch.Tensor
    index: dict[str, torch.Tensor]
    seqs: list[tuple[int, int, int, int, int, np.ndarray]]  # (slot, r0, r1, cache_len, start, reach)
    window: int | None
    scale: float


def _reach(parents: list[int] | None, n: int) -> np.ndarray:
    bits = tree_bits(parents, n, 2)
    return np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :n].astype(bool)


def _case(gen: torch.Generator, *, heads: int, kv: int, dim: int, rows: int, window: int | None,
          shapes: list[tuple[int, int, str]], device: torch.device, dtype=torch.float32) -> Case:
    """shapes: per sequence (cache_len, rows, kind) with kind "chain" or "tree"; rows past the
    sequences' are padding (scratch slot 0, no cache)."""
    cap = 64  # two pieces of 32 keys under the interpreter (kernels/tree_attention_triton.py)
    slots = len(shapes) + 1
    rnd = lambda *s: torch.randn(*s, generator=gen).to(dtype)  # noqa: E731
    kc, vc = rnd(slots, kv, cap, dim), rnd(slots, kv, cap, dim)
    q, k, v = rnd(rows, heads, dim), rnd(rows, kv, dim), rnd(rows, kv, dim)
    words = -(-rows // 64)
    idx = {"row_slot": np.zeros(rows, np.int64), "row_first": np.arange(rows, dtype=np.int64),
           "row_bits": np.zeros((rows, words), np.int64), "positions": np.zeros(rows, np.int64),
           "cache_len": np.zeros(rows, np.int64), "cache_start": np.zeros(rows, np.int64)}
    idx["row_bits"][:, 0] = 1
    seqs = []
    r0 = 0
    for s, (clen, n, kind) in enumerate(shapes):
        slot = s + 1
        parents = None
        if kind == "tree":
            parents = [-1] + [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(1, n)]
        reach = _reach(parents, n)
        # a sliding group may have dropped its oldest entries: entry 0 then holds position `start`
        start = 3 if window is not None and clen > 10 else 0
        r1 = r0 + n
        idx["row_slot"][r0:r1] = slot
        idx["row_first"][r0:r1] = r0
        idx["row_bits"][r0:r1] = tree_bits(parents, n, words)
        idx["positions"][r0:r1] = start + clen + reach.sum(1) - 1
        idx["cache_len"][r0:r1] = clen
        idx["cache_start"][r0:r1] = start
        seqs.append((slot, r0, r1, clen, start, reach))
        r0 = r1
    assert r0 <= rows
    index = {name: torch.from_numpy(a).to(device) for name, a in idx.items()}
    return Case(q.to(device), k.to(device), v.to(device), kc.to(device), vc.to(device), index, seqs, window,
                dim ** -0.5)


def _run(case: Case, backend: str) -> torch.Tensor:
    i = case.index
    return tree_attention(case.q, case.k, case.v, case.kc, case.vc, i["row_slot"], i["row_first"],
                          i["row_bits"], i["positions"], i["cache_len"], i["cache_start"], scale=case.scale,
                          window=case.window, backend=backend)


def _sdpa(case: Case) -> torch.Tensor:
    """Per sequence: SDPA over its cache entries and its own rows, with an explicit boolean mask."""
    rows, heads, _ = case.q.shape
    out = torch.empty(rows, heads, case.v.shape[-1], dtype=torch.float32)
    q, k, v = case.q.float().cpu(), case.k.float().cpu(), case.v.float().cpu()
    kc, vc = case.kc.float().cpu(), case.vc.float().cpu()
    pos = case.index["positions"].cpu()
    seen: set[int] = set()
    for slot, r0, r1, clen, start, reach in case.seqs:
        keys = torch.cat([kc[slot, :, :clen], k[r0:r1].transpose(0, 1)], dim=1)  # [KV, clen + n, D]
        vals = torch.cat([vc[slot, :, :clen], v[r0:r1].transpose(0, 1)], dim=1)
        key_pos = torch.cat([start + torch.arange(clen), pos[r0:r1]])
        mask = torch.cat([torch.ones(r1 - r0, clen, dtype=torch.bool), torch.from_numpy(reach)], dim=1)
        if case.window is not None:
            mask &= (pos[r0:r1, None] - key_pos[None, :]) < case.window
        o = F.scaled_dot_product_attention(q[r0:r1].transpose(0, 1)[None], keys[None], vals[None],
                                           attn_mask=mask[None, None], scale=case.scale, enable_gqa=True)
        out[r0:r1] = o[0].transpose(0, 1)
        seen.update(range(r0, r1))
    kv = case.k.shape[1]
    for r in range(rows):  # padding: a row that sees only itself gets its own value, head by head
        if r not in seen:
            out[r] = v[r].repeat_interleave(heads // kv, dim=0)
    return out


CASES = [
    # heads, kv heads, window, per sequence (cache length, rows, kind); 16 rows, the rest padding
    (4, 4, None, [(0, 5, "chain"), (7, 1, "chain"), (40, 6, "tree")]),
    (4, 2, 6, [(0, 5, "chain"), (7, 1, "chain"), (40, 6, "tree")]),
    (6, 2, None, [(17, 12, "tree"), (1, 1, "chain")]),
    (8, 1, 6, [(33, 1, "chain"), (50, 3, "tree"), (0, 9, "chain")]),
]


@pytest.mark.parametrize("case_index", range(len(CASES)), ids=["mha", "gqa2-window", "gqa3", "mqa-window"])
def test_the_twin_matches_sdpa_and_the_kernel_matches_the_twin(device, case_index) -> None:
    heads, kv, window, shapes = CASES[case_index]
    gen = torch.Generator().manual_seed(case_index)
    case = _case(gen, heads=heads, kv=kv, dim=16, rows=16, window=window, shapes=shapes, device=device)
    twin = _run(case, "torch")
    torch.testing.assert_close(twin.cpu(), _sdpa(case), atol=2e-5, rtol=1e-5)
    pytest.importorskip("triton")
    got = _run(case, "triton")
    assert got.shape == twin.shape and got.dtype == twin.dtype
    torch.testing.assert_close(got, twin, atol=2e-5, rtol=1e-5)


def test_a_sequence_longer_than_64_rows_uses_two_words_of_tree_bits(device) -> None:
    """Rows past the 64th of a sequence read their second word of bits; head size 32, a window."""
    gen = torch.Generator().manual_seed(7)
    case = _case(gen, heads=2, kv=1, dim=32, rows=68, window=50, device=device, shapes=[(20, 67, "tree")])
    assert case.index["row_bits"].shape == (68, 2)
    twin = _run(case, "torch")
    torch.testing.assert_close(twin.cpu(), _sdpa(case), atol=2e-5, rtol=1e-5)
    pytest.importorskip("triton")
    torch.testing.assert_close(_run(case, "triton"), twin, atol=2e-5, rtol=1e-5)


def test_one_piece_per_row_gives_the_same_attention(device, monkeypatch) -> None:
    """Buckets of many rows take each row's whole cache in one program (no flash-decoding split)."""
    pytest.importorskip("triton")
    from lookupspec.kernels import tree_attention_triton

    gen = torch.Generator().manual_seed(5)
    case = _case(gen, heads=4, kv=2, dim=16, rows=16, window=6, device=device,
                 shapes=[(50, 3, "tree"), (40, 2, "chain")])
    monkeypatch.setattr(tree_attention_triton, "_pieces", lambda rows, kv, capacity, dev: (1, capacity))
    torch.testing.assert_close(_run(case, "triton"), _run(case, "torch"), atol=2e-5, rtol=1e-5)


def test_few_rows_split_their_cache_into_pieces_and_many_rows_do_not(monkeypatch) -> None:
    pytest.importorskip("triton")
    from lookupspec.kernels import tree_attention_triton as m

    monkeypatch.setattr(m, "_multiprocessors", lambda index: 132)  # an H100 / H200
    cuda = torch.device("cuda")
    assert m._pieces(1, 8, 1088, cuda) == (5, 256)  # a decode row at a 1,000-token cache: 40 programs
    assert m._pieces(64, 8, 1088, cuda) == (1, 1088)  # 512 programs already
    chunks, chunk = m._pieces(1, 8, 32768, cuda)  # a long context: at most 32 pieces, of whole blocks
    assert chunks == 32 and chunks * chunk >= 32768 and chunk % 64 == 0


def test_bfloat16_agrees_within_its_rounding(device) -> None:
    gen = torch.Generator().manual_seed(3)
    case = _case(gen, heads=4, kv=2, dim=16, rows=16, window=None, device=device, dtype=torch.bfloat16,
                 shapes=[(30, 4, "tree"), (5, 1, "chain")])
    twin = _run(case, "torch")
    assert twin.dtype == torch.bfloat16
    torch.testing.assert_close(twin.float().cpu(), _sdpa(case), atol=2e-2, rtol=2e-2)
    pytest.importorskip("triton")
    torch.testing.assert_close(_run(case, "triton").float(), twin.float(), atol=2e-2, rtol=2e-2)


def test_rows_see_nothing_of_other_sequences_or_hidden_entries(device) -> None:
    """Changing another slot, a cache entry past a row's cache length, a row that is not an ancestor
    or a key outside the window leaves a row's output exactly as it was."""
    gen = torch.Generator().manual_seed(11)
    case = _case(gen, heads=4, kv=2, dim=16, rows=16, window=8, device=device,
                 shapes=[(20, 4, "tree"), (12, 3, "chain")])
    before = _run(case, "torch")
    slot_a, r0, r1, clen, start, reach = case.seqs[0]
    case.kc[case.seqs[1][0]] += 5  # the other sequence's slot
    case.kc[slot_a, :, clen:] += 5  # entries past the cache length (where this step's rows go)
    hidden = int(case.index["positions"][r0]) - 8 - start  # the newest entry the window hides from row r0
    case.kc[slot_a, :, : hidden + 1] += 5
    after = _run(case, "torch")
    torch.testing.assert_close(after[r0], before[r0], atol=0, rtol=0)
    non_ancestors = [j for j in range(r1 - r0) if not reach[r1 - r0 - 1, j]]
    if non_ancestors:
        case.k[r0 + non_ancestors[0]] += 5
        torch.testing.assert_close(_run(case, "torch")[r1 - 1], after[r1 - 1], atol=0, rtol=0)


_COMPILE = """
import inspect, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from lookupspec.kernels import tree_attention_triton as m

def build(kernel, types, const, arch):
    names = list(inspect.signature(kernel.fn).parameters)
    sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in names}
    src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(n),): v for n, v in const.items()})
    options = {"num_warps": 4, "enable_fp_fusion": False}
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)

for arch in (90,):
    for dt, dim, group, window in (("bf16", 128, 4, True), ("fp32", 64, 3, False)):
        types = {p: "*" + dt for p in ("q_ptr", "k_ptr", "v_ptr", "kc_ptr", "vc_ptr", "o_ptr")}
        types |= {p: "*fp32" for p in ("pm_ptr", "pl_ptr", "pacc_ptr")}
        index = ("slot_ptr", "first_ptr", "bits_ptr", "pos_ptr", "clen_ptr", "cstart_ptr")
        types |= {p: "*i64" for p in index}
        types["scale"] = "fp32"
        block_g = triton.next_power_of_2(group)
        build(m._tree_attention_kernel, types, dict(H=8 * group, D=dim, DV=dim, G=group, WORDS=2, PIECES=5,
              BLOCK_G=block_g, BLOCK_N=64, BLOCK_D=dim, BLOCK_DV=dim, HAS_WINDOW=window), arch)
        build(m._combine_kernel, types, dict(H=8 * group, DV=dim, PIECES=5, BLOCK_P=8, BLOCK_DV=dim), arch)
print("compiled")
"""


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine compiles them in the tests above")
def test_the_kernels_compile_for_hopper_without_a_gpu(tmp_path) -> None:
    """The interpreter forgives what the compiler does not (types of loop bounds, branch-carried values,
    dot shapes): compile both kernels to sm_90 cubins (H100, H200) with Triton's bundled ptxas."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia.compiler")
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-W", "error", "-c", _COMPILE], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]
