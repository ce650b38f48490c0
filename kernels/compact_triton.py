"""KV-cache compaction after a tree step (Triton): the twins of ``reference.compact_kv`` and
``reference.compact_pool``.

One program per (sequence, cache row, kv head, head_dim block) loads the accepted entries' rows into
registers, waits for the whole program at a barrier, and stores them at ``base + j``: stores only
where the entry moves (``accepted[j] != j``), so an accepted chain costs one small read of the path.

``compact_pool`` covers every layer's keys and values of a slot pool in one launch: the pool's
tensors (one per group of layers that share a shape and window, two when keys and values differ in
width) are separate allocations that grow independently, so the kernel reads them through a table of
row addresses (:mod:`.compact_plan`) instead of one base pointer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from .compact_plan import (
    COL_ADDR,
    COL_DIM,
    COL_GROUP,
    COL_HEADS,
    COL_STRIDE_HEAD,
    COL_STRIDE_POS,
    COL_STRIDE_SLOT,
)
from .variants import launch

__all__ = ["compact_kv", "compact_pool"]

_ADDR, _DIM, _GROUP, _HEADS = (tl.constexpr(c) for c in (COL_ADDR, COL_DIM, COL_GROUP, COL_HEADS))
_S_HEAD, _S_POS, _S_SLOT = (tl.constexpr(c) for c in (COL_STRIDE_HEAD, COL_STRIDE_POS, COL_STRIDE_SLOT))


@triton.jit(do_not_specialize=["H", "D", "M"])
def _compact_kernel(
    kv_ptr, s_b, s_h, s_s, s_d,  # [B, H, S, D]
    path_ptr, num_ptr, base_ptr,  # [B, M] int64, [B] int64, [B] int64
    H, D, M,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    j = tl.arange(0, BLOCK_M)
    a = tl.load(num_ptr + b)
    base = tl.load(base_ptr + b)
    src = tl.load(path_ptr + b * M + j, mask=j < a, other=0)
    move = (j < a) & (src != j)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    m2 = move[:, None] & (d < D)[None, :]
    head = kv_ptr + b.to(tl.int64) * s_b + h.to(tl.int64) * s_h
    vals = tl.load(head + (base + src)[:, None] * s_s + d[None, :] * s_d, mask=m2)
    # an entry may be read by one thread and overwritten by another: every read happens first
    tl.debug_barrier()
    tl.store(head + (base + j)[:, None] * s_s + d[None, :] * s_d, vals, mask=m2)


def compact_kv(
    kv: torch.Tensor,  # [batch, kv_heads, seq, head_dim] one layer's keys or values, edited in place
    accepted: torch.Tensor,  # [batch, max_nodes] accepted node indices, -1 padded (verify output)
    num_accepted: torch.Tensor,  # [batch]
    base: torch.Tensor | int,  # [batch] (or one int) cache position of draft node 0
) -> None:
    """Move the accepted nodes' entries from ``base + accepted[j]`` to ``base + j``."""
    if kv.dim() != 4 or accepted.dim() != 2 or accepted.shape[0] != kv.shape[0]:
        raise ValueError(f"kv must be [batch, heads, seq, dim] and accepted [batch, max_nodes], got "
                         f"{tuple(kv.shape)} and {tuple(accepted.shape)}")
    b, h, s, d = kv.shape
    m = accepted.shape[1]
    if m == 0 or s == 0 or kv.numel() == 0:
        return
    dev = kv.device
    base_t = torch.as_tensor(base, device=dev, dtype=torch.int64).expand(b).contiguous()
    path = accepted.to(dev, torch.int64).contiguous()
    num = num_accepted.to(dev, torch.int64).contiguous()
    block_d = min(triton.next_power_of_2(d), 128)
    launch(_compact_kernel, (b * h, triton.cdiv(d, block_d)),
        kv, kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3), path, num, base_t, h, d, m,
        BLOCK_M=triton.next_power_of_2(m), BLOCK_D=block_d, num_warps=4 if dev.type == "cuda" else 1,
        enable_fp_fusion=False,
    )


@triton.jit(do_not_specialize=["R", "M", "G"])
def _compact_pool_kernel(
    table_ptr,  # [R, COLS] int64: one row per (pool tensor, cache row), see compact_plan
    slot_ptr,  # [B] int64 slot of each sequence
    base_ptr,  # [B, G] int64 entry of draft node 0 of each sequence in each group
    path_ptr, num_ptr,  # [B, M] int64 accepted nodes (-1 padded), [B] int64
    kv_ptr,  # any pool tensor: only its element type is used
    R, M, G,
    COLS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    b = pid // R
    r = pid % R
    h = tl.program_id(1)
    row = table_ptr + r * COLS
    heads = tl.load(row + _HEADS)
    if h < heads:
        dim = tl.load(row + _DIM)
        slot = tl.load(slot_ptr + b)
        base = tl.load(base_ptr + b * G + tl.load(row + _GROUP))
        a = tl.load(num_ptr + b)
        j = tl.arange(0, BLOCK_M)
        src = tl.load(path_ptr + b * M + j, mask=j < a, other=0)
        move = (j < a) & (src != j)
        d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
        m2 = move[:, None] & (d < dim)[None, :]
        start = tl.load(row + _ADDR).to(tl.pointer_type(kv_ptr.dtype.element_ty))
        head = start + slot * tl.load(row + _S_SLOT) + h.to(tl.int64) * tl.load(row + _S_HEAD)
        s_s = tl.load(row + _S_POS)
        vals = tl.load(head + (base + src)[:, None] * s_s + d[None, :], mask=m2)
        tl.debug_barrier()  # every read of the program before any of its writes (see compact_kv)
        tl.store(head + (base + j)[:, None] * s_s + d[None, :], vals, mask=m2)


def compact_pool(
    tensors: Sequence[torch.Tensor],  # the pool's [rows, slots, kv_heads, capacity, dim] tensors
    tensor_groups: Sequence[int],  # group of each tensor (the column of `base` it uses)
    table: torch.Tensor,  # [R, COLS] int64 (compact_plan.pool_table of `tensors`)
    slots: torch.Tensor,  # [B] int64
    base: torch.Tensor,  # [B, G] int64
    accepted: torch.Tensor,  # [B, M] accepted node indices, -1 padded
    num_accepted: torch.Tensor,  # [B]
) -> None:
    """Move every sequence's accepted entries from ``base + accepted[j]`` to ``base + j`` in every row
    of every pool tensor: one launch."""
    b, m = accepted.shape
    if m == 0 or b == 0 or table.shape[0] == 0:
        return
    dev = accepted.device
    heads = max(int(t.shape[2]) for t in tensors)
    dim = max(int(t.shape[4]) for t in tensors)
    block_d = min(triton.next_power_of_2(dim), 128)
    rows = table.shape[0]
    launch(_compact_pool_kernel, (b * rows, heads, triton.cdiv(dim, block_d)),
        table, slots, base, accepted.to(torch.int64).contiguous(), num_accepted.to(torch.int64).contiguous(),
        tensors[0], rows, m, base.shape[1],
        COLS=table.shape[1], BLOCK_M=triton.next_power_of_2(m), BLOCK_D=block_d,
        num_warps=4 if dev.type == "cuda" else 1, enable_fp_fusion=False,
    )
