"""Tree attention mask builder (Triton): the twin of ``reference.tree_mask``, same signature.

One program per draft node: it climbs its ancestors in registers (the parents vector is loaded once)
and writes its mask row: 0 over the prefix and over itself and its ancestors, ``finfo(dtype).min``
elsewhere, plus its position id ``prefix_len + depth``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .variants import launch

__all__ = ["tree_mask"]


@triton.jit(do_not_specialize=["n", "prefix"])  # per-step sizes: one compiled variant per BLOCK_N
def _tree_mask_kernel(
    parents_ptr,  # [n] int32
    mask_ptr,  # [n, prefix + n] model dtype
    pos_ptr,  # [n] int64
    n, prefix, min_value,
    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
):
    i = tl.program_id(0)
    idx = tl.arange(0, BLOCK_N)
    par = tl.load(parents_ptr + idx, mask=idx < n, other=-1)
    visible = idx == i
    depth = i * 0
    cur = tl.load(parents_ptr + i)
    # A tree has at most n ancestors per node and every parent in [-1, i): the walk stops there even
    # for a malformed array (the dispatcher checks host arrays; a cycle must not hang the GPU).
    while (cur >= 0) & (cur < i) & (depth < n):
        visible = visible | (idx == cur)
        depth += 1
        cur = tl.sum(tl.where(idx == cur, par, 0), axis=0)
    tl.store(pos_ptr + i, (prefix + depth).to(tl.int64))
    row = mask_ptr + i.to(tl.int64) * (prefix + n)
    zero = tl.zeros([BLOCK_C], dtype=mask_ptr.dtype.element_ty)
    for start in range(0, prefix, BLOCK_C):
        cols = start + tl.arange(0, BLOCK_C)
        tl.store(row + cols, zero, mask=cols < prefix)
    vals = tl.where(visible, 0.0, min_value).to(mask_ptr.dtype.element_ty)
    tl.store(row + prefix + idx, vals, mask=idx < n)


def tree_mask(
    parents: torch.Tensor,  # [n] parent index, -1 = attends only to the prefix (and itself)
    prefix_len: int,  # tokens already in the KV cache
    dtype: torch.dtype,  # the model's dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive tree attention mask [1, 1, n, prefix_len + n] and position ids [1, n] int64."""
    if parents.dim() != 1:
        raise ValueError(f"parents must be [n], got {tuple(parents.shape)}")
    dev = parents.device
    n = parents.numel()
    mask = torch.empty((1, 1, n, prefix_len + n), dtype=dtype, device=dev)
    positions = torch.empty((1, n), dtype=torch.int64, device=dev)
    if n == 0:
        return mask, positions
    launch(_tree_mask_kernel, (n,),
        parents.to(torch.int32), mask, positions, n, prefix_len, torch.finfo(dtype).min,
        BLOCK_N=triton.next_power_of_2(n), BLOCK_C=1024 if dev.type == "cuda" else 64,
        num_warps=4 if dev.type == "cuda" else 1, enable_fp_fusion=False,
    )
    return mask, positions
