"""Torch twin of ``tree_attention_triton.tree_attention``: same signature, same results up to float
summation order, plain fixed-shape torch (re-exported by :mod:`.reference`, which the dispatcher
reads).

The static step's attention (:mod:`lookupspec.runtime.static`): every row of a bucket attends to

1. its slot's committed cache entries ``e < cache_len[r]`` (position ``cache_start[r] + e``), and
2. the step's own rows ``j`` in ``[row_first[r], r]`` whose bit ``j - row_first[r]`` is set in
   ``row_bits[r]`` (itself and its tree ancestors, or every earlier row of a causal chunk), whose
   keys and values are the forward's own ``key`` / ``value`` rows, not the pool's,

and, with a sliding ``window`` ``W``, only to keys at positions ``p > positions[r] - W``.

Every shape is fixed by the bucket and the pool (no ``.item()``, no data-dependent shape), so the twin
captures in a CUDA graph too; it computes each row's scores over its slot's whole capacity (a
``[rows, heads, capacity]`` score tensor per layer), which the Triton kernel does not, so it is the
reference and the CPU path, not the fast one.

Example (one head, no cache, bucket of 3 rows): a root and two children, ``row_first = [0, 0, 0]``,
``row_bits = [[0b001], [0b011], [0b101]]``: row 1 sees rows 0 and 1, row 2 sees rows 0 and 2.
"""

from __future__ import annotations

import torch

__all__ = ["tree_attention", "visible_cache", "visible_own"]


def visible_own(row_first: torch.Tensor, row_bits: torch.Tensor, positions: torch.Tensor,
                window: int | None) -> torch.Tensor:
    """[R, R] bool: row ``r`` sees the step's row ``j`` (module docstring, part 2)."""
    rows = row_first.numel()
    j = torch.arange(rows, device=row_first.device)
    rel = j[None, :] - row_first[:, None]  # [R, R]
    in_range = (rel >= 0) & (j[None, :] <= j[:, None])
    relc = rel.clamp(min=0)
    word = torch.gather(row_bits, 1, (relc // 64).clamp(max=row_bits.shape[1] - 1))
    vis = in_range & (torch.bitwise_right_shift(word, relc % 64) & 1).bool()
    if window is not None:
        vis &= (positions[:, None] - positions[None, :]) < window
    return vis


def visible_cache(cache_len: torch.Tensor, cache_start: torch.Tensor, positions: torch.Tensor,
                  capacity: int, window: int | None) -> torch.Tensor:
    """[R, capacity] bool: row ``r`` sees entry ``e`` of its slot (module docstring, part 1)."""
    e = torch.arange(capacity, device=cache_len.device)
    vis = e[None, :] < cache_len[:, None]
    if window is not None:
        vis &= (positions[:, None] - (cache_start[:, None] + e[None, :])) < window
    return vis


def tree_attention(
    query: torch.Tensor,  # [R, H, D] the rows' queries (rotary applied)
    key: torch.Tensor,  # [R, KV, D] the rows' own keys (rotary applied)
    value: torch.Tensor,  # [R, KV, DV]
    key_cache: torch.Tensor,  # [slots, KV, capacity, D] one layer's keys in the pool
    value_cache: torch.Tensor,  # [slots, KV, capacity, DV]
    row_slot: torch.Tensor,  # [R] int64 slot whose cache each row reads
    row_first: torch.Tensor,  # [R] int64 first row of each row's sequence
    row_bits: torch.Tensor,  # [R, W] int64 ancestor-or-self bits, relative to row_first
    positions: torch.Tensor,  # [R] int64
    cache_len: torch.Tensor,  # [R] int64 committed entries of the slot (this layer's group)
    cache_start: torch.Tensor,  # [R] int64 position of entry 0 of the slot (this layer's group)
    *,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Attention of a bucket's rows over their caches and their own tree: [R, H, DV] in the query's
    dtype (scores, softmax and sums in float32)."""
    rows, heads, dim = query.shape
    kv = key.shape[1]
    groups = heads // kv
    capacity = key_cache.shape[2]
    q = query.float().reshape(rows, kv, groups, dim)
    kc = key_cache[row_slot].float()  # [R, KV, capacity, D]
    vc = value_cache[row_slot].float()
    scores_c = torch.einsum("rkgd,rknd->rkgn", q, kc)
    scores_o = torch.einsum("rkgd,jkd->rkgj", q, key.float())  # [R, KV, G, R]
    vis_c = visible_cache(cache_len, cache_start, positions, capacity, window)
    vis_o = visible_own(row_first, row_bits, positions, window)
    scores = torch.cat([scores_c, scores_o], dim=-1) * scale
    vis = torch.cat([vis_c, vis_o], dim=-1)[:, None, None, :]
    probs = torch.softmax(scores.masked_fill(~vis, float("-inf")), dim=-1)
    out = (torch.einsum("rkgn,rknd->rkgd", probs[..., :capacity], vc)
           + torch.einsum("rkgj,jkd->rkgd", probs[..., capacity:], value.float()))
    return out.reshape(rows, heads, value.shape[-1]).to(query.dtype)
