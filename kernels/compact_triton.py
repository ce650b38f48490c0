"""KV-cache compaction after a tree step (Triton): the twin of ``reference.compact_kv``.

One program per (batch, kv head, head_dim block) loads the accepted entries' rows into registers, waits
for the whole program at a barrier, and stores them at ``base + j``: stores only where the entry
moves (``accepted[j] != j``), so an accepted chain costs one small read of the path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["compact_kv"]


@triton.jit
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
    _compact_kernel[(b * h, triton.cdiv(d, block_d))](
        kv, kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3), path, num, base_t, h, d, m,
        BLOCK_M=triton.next_power_of_2(m), BLOCK_D=block_d, num_warps=4 if dev.type == "cuda" else 1,
        enable_fp_fusion=False,
    )
