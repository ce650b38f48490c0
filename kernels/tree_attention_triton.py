"""The static step's attention (Triton): the twin of ``reference.tree_attention``, same signature.

Each row sees two key ranges, and one online softmax (flash attention) runs over each piece of them:

1. the committed cache entries of the row's slot, ``[lo, cache_len)``, read in place from the KV
   pool (``lo`` skips the entries a sliding window hides: ``positions - window + 1 - cache_start``);
2. the step's own rows ``[row_first, r]``, read from the forward's key/value rows, masked by the
   row's tree bits (itself and its ancestors, or a causal chunk's earlier rows) and the window.

Flash-decoding: a decode step has one row per sequence, so one program per row and key/value head
would leave most of a GPU idle while each walks a 1,000-token cache. The cache range is cut into
``CHUNK``-key pieces, one program each (grid ``[rows, kv_heads, chunks + 1]``, the last program of a
row taking its own rows); each writes its running max, sum and weighted sum, and a second kernel
folds a row's pieces in order. Buckets of many rows have parallelism enough: they take the whole
cache in one piece (``chunks = 1``). The pieces depend on the pool's capacity and the bucket's
rows, never on the data, so one compiled variant serves every step of a bucket and replays inside a
CUDA graph; no ``[rows x context]`` mask exists anywhere.

The query heads that share a key/value head are the rows of one ``tl.dot`` (``BLOCK_G``: their
count, padded to a power of two), so each key block is read once per group. Every product, the
softmax and the sums run in IEEE float32 (no TF32), whatever the storage dtype, as the twin computes
them: a program works on one row, so its products are too narrow for tensor cores to matter, and
bfloat16 operands would round the probabilities before the value sum. (Triton's interpreter also
gets bfloat16 ``tl.dot`` wrong.)
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .variants import launch

__all__ = ["tree_attention"]

CHUNK_CUDA = 256  # cache keys per program
MAX_CHUNKS = 32  # longer caches take longer pieces: the folding stays small
CHUNK_INTERPRETED = 32  # under the interpreter: the tests' short caches still span several pieces


@triton.jit
def _online_softmax(m_i, l_i, acc, s, v):
    """Fold a block of scores ``s`` [G, N] and values ``v`` [N, DV] into the running max, sum and
    weighted sum; a block whose scores are all -inf changes nothing (no NaN from -inf - -inf)."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
    return m_new, l_i, acc


@triton.jit
def _tree_attention_kernel(
    q_ptr, sq_r, sq_h,  # [R, H, D]
    k_ptr, sk_r, sk_h,  # [R, KV, D] the rows' own keys
    v_ptr, sv_r, sv_h,  # [R, KV, DV]
    kc_ptr, skc_s, skc_h, skc_e,  # [slots, KV, capacity, D]
    vc_ptr, svc_s, svc_h, svc_e,  # [slots, KV, capacity, DV]
    pm_ptr, pl_ptr, pacc_ptr,  # [R, H, PIECES] float32 max and sum, [R, H, PIECES, DV] weighted sum
    slot_ptr, first_ptr, bits_ptr, pos_ptr, clen_ptr, cstart_ptr,  # [R] int64 ([R, WORDS] bits)
    scale, window, chunk,
    H: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, G: tl.constexpr, WORDS: tl.constexpr,
    PIECES: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
):
    r = tl.program_id(0)
    kvh = tl.program_id(1)
    piece = tl.program_id(2)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    heads = kvh * G + g
    q_mask = (g < G)[:, None] & (d < D)[None, :]
    q = tl.load(q_ptr + r.to(tl.int64) * sq_r + heads[:, None] * sq_h + d[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32)
    q_pos = tl.load(pos_ptr + r)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_DV], dtype=tl.float32)
    if piece < PIECES - 1:
        # 1. a piece of the slot's cache; a sliding window's hidden entries are never read
        slot = tl.load(slot_ptr + r)
        cache_len = tl.load(clen_ptr + r)
        lo = cache_len * 0
        if HAS_WINDOW:
            lo = tl.maximum(q_pos - window + 1 - tl.load(cstart_ptr + r), 0)
        start = lo + piece * chunk
        end = tl.minimum(start + chunk, cache_len)
        kc = kc_ptr + slot * skc_s + kvh * skc_h
        vc = vc_ptr + slot * svc_s + kvh * svc_h
        for n0 in range(start, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            valid = n < end
            k = tl.load(kc + n[:, None] * skc_e + d[None, :], mask=valid[:, None] & (d < D)[None, :],
                        other=0.0)
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee") * scale
            s = tl.where(valid[None, :], s, float("-inf"))
            v = tl.load(vc + n[:, None] * svc_e + dv[None, :], mask=valid[:, None] & (dv < DV)[None, :],
                        other=0.0)
            m_i, l_i, acc = _online_softmax(m_i, l_i, acc, s, v)
    else:
        # 2. the step's own rows: the row itself and its ancestors, all at or before it
        first = tl.load(first_ptr + r)
        for n0 in range(first, r + 1, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            in_range = n <= r
            rel = tl.where(in_range, n - first, 0)
            word = tl.load(bits_ptr + r.to(tl.int64) * WORDS + rel // 64, mask=in_range, other=0)
            valid = in_range & (((word >> (rel % 64)) & 1) != 0)
            if HAS_WINDOW:
                k_pos = tl.load(pos_ptr + n, mask=in_range, other=0)
                valid = valid & (q_pos - k_pos < window)
            k = tl.load(k_ptr + n[:, None].to(tl.int64) * sk_r + kvh * sk_h + d[None, :],
                        mask=valid[:, None] & (d < D)[None, :], other=0.0)
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee") * scale
            s = tl.where(valid[None, :], s, float("-inf"))
            v = tl.load(v_ptr + n[:, None].to(tl.int64) * sv_r + kvh * sv_h + dv[None, :],
                        mask=valid[:, None] & (dv < DV)[None, :], other=0.0)
            m_i, l_i, acc = _online_softmax(m_i, l_i, acc, s, v)
    part = (r.to(tl.int64) * H + heads) * PIECES + piece  # [BLOCK_G]
    tl.store(pm_ptr + part, m_i, mask=g < G)
    tl.store(pl_ptr + part, l_i, mask=g < G)
    tl.store(pacc_ptr + part[:, None] * DV + dv[None, :], acc, mask=(g < G)[:, None] & (dv < DV)[None, :])


@triton.jit
def _combine_kernel(
    pm_ptr, pl_ptr, pacc_ptr,  # as written by _tree_attention_kernel
    o_ptr, so_r, so_h,  # [R, H, DV]
    H: tl.constexpr, DV: tl.constexpr, PIECES: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    """One program per (row, head): its pieces folded in order. A row sees itself, so its own-rows
    piece has a finite max and the sum is positive."""
    r = tl.program_id(0)
    h = tl.program_id(1)
    p = tl.arange(0, BLOCK_P)
    dv = tl.arange(0, BLOCK_DV)
    base = (r.to(tl.int64) * H + h) * PIECES
    m = tl.load(pm_ptr + base + p, mask=p < PIECES, other=float("-inf"))
    m_max = tl.max(m, axis=0)
    w = tl.exp(m - m_max)  # 0 for pieces that saw no key
    l_sum = tl.sum(w * tl.load(pl_ptr + base + p, mask=p < PIECES, other=0.0), axis=0)
    acc = tl.load(pacc_ptr + (base + p)[:, None] * DV + dv[None, :],
                  mask=(p < PIECES)[:, None] & (dv < DV)[None, :], other=0.0)
    out = tl.sum(w[:, None] * acc, axis=0) / l_sum
    tl.store(o_ptr + r.to(tl.int64) * so_r + h * so_h + dv, out.to(o_ptr.dtype.element_ty), mask=dv < DV)


@functools.cache
def _multiprocessors(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def _pieces(rows: int, kv: int, capacity: int, device: torch.device) -> tuple[int, int]:
    """(cache pieces per row, keys per piece): enough programs to fill the GPU when rows are few,
    one piece per row when they are many. A function of the shapes alone, never of the data."""
    if device.type != "cuda":
        chunk = CHUNK_INTERPRETED
        return max(1, -(-capacity // chunk)), chunk
    if rows * kv >= 2 * _multiprocessors(device.index if device.index is not None else 0):
        return 1, max(capacity, 1)
    chunks = min(MAX_CHUNKS, max(1, -(-capacity // CHUNK_CUDA)))
    chunk = -(-capacity // chunks)
    return chunks, -(-chunk // 64) * 64  # whole key blocks


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def tree_attention(
    query: torch.Tensor,  # [R, H, D] the rows' queries (rotary applied)
    key: torch.Tensor,  # [R, KV, D] the rows' own keys (rotary applied)
    value: torch.Tensor,  # [R, KV, DV]
    key_cache: torch.Tensor,  # [slots, KV, capacity, D]
    value_cache: torch.Tensor,  # [slots, KV, capacity, DV]
    row_slot: torch.Tensor,  # [R] int64
    row_first: torch.Tensor,  # [R] int64
    row_bits: torch.Tensor,  # [R, W] int64
    positions: torch.Tensor,  # [R] int64
    cache_len: torch.Tensor,  # [R] int64
    cache_start: torch.Tensor,  # [R] int64
    *,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Attention of a bucket's rows over their caches and their own tree: [R, H, DV] in the query's
    dtype (see the module docstring and ``reference.tree_attention``)."""
    rows, heads, dim = query.shape
    kv, dim_v = key.shape[1], value.shape[-1]
    if heads % kv or key_cache.shape[1] != kv or key_cache.shape[-1] != dim or value_cache.shape[-1] != dim_v:
        raise ValueError(f"tree_attention: query {tuple(query.shape)}, key {tuple(key.shape)}, caches "
                         f"{tuple(key_cache.shape)} / {tuple(value_cache.shape)} do not agree")
    for name, t in (("row_slot", row_slot), ("row_first", row_first), ("row_bits", row_bits),
                    ("positions", positions), ("cache_len", cache_len), ("cache_start", cache_start)):
        if t.dtype != torch.int64 or not t.is_contiguous() or t.shape[0] != rows:
            raise ValueError(f"tree_attention: {name} must be contiguous int64 with {rows} rows")
    query, key, value = (_last_dim_contiguous(t) for t in (query, key, value))
    key_cache, value_cache = _last_dim_contiguous(key_cache), _last_dim_contiguous(value_cache)
    dev = query.device
    out = torch.empty((rows, heads, dim_v), dtype=query.dtype, device=dev)
    if rows == 0:
        return out
    cuda = dev.type == "cuda"
    chunks, chunk = _pieces(rows, kv, key_cache.shape[2], dev)
    pieces = chunks + 1  # the last: the row's own rows
    part_m = torch.empty((rows, heads, pieces), dtype=torch.float32, device=dev)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty((rows, heads, pieces, dim_v), dtype=torch.float32, device=dev)
    group = heads // kv
    block_dv = max(16, triton.next_power_of_2(dim_v))
    warps = 4 if cuda else 1
    launch(_tree_attention_kernel, (rows, kv, pieces),
        query, query.stride(0), query.stride(1),
        key, key.stride(0), key.stride(1),
        value, value.stride(0), value.stride(1),
        key_cache, key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache, value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        part_m, part_l, part_acc,
        row_slot, row_first, row_bits, positions, cache_len, cache_start,
        float(scale), int(window or 0), chunk,
        H=heads, D=dim, DV=dim_v, G=group, WORDS=row_bits.shape[1], PIECES=pieces,
        BLOCK_G=triton.next_power_of_2(group),  # float32 products: no tensor-core minimum of 16 rows
        # small key blocks under the interpreter: the tests' short caches then span several blocks
        BLOCK_N=64 if cuda else 16,
        BLOCK_D=max(16, triton.next_power_of_2(dim)), BLOCK_DV=block_dv,
        HAS_WINDOW=window is not None,
        num_warps=warps, enable_fp_fusion=False,
    )
    launch(_combine_kernel, (rows, heads), part_m, part_l, part_acc, out, out.stride(0), out.stride(1),
           H=heads, DV=dim_v, PIECES=pieces, BLOCK_P=triton.next_power_of_2(pieces), BLOCK_DV=block_dv,
           num_warps=warps, enable_fp_fusion=False)
    return out
