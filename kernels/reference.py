"""Torch twins of the Triton kernels: same signatures, same results, plain batched torch.

They are the CPU path of the engine and the reference the kernels are tested against; they must
agree exactly with ``lookupspec/verify.py`` (one request at a time) and with ``lookupspec/sampling.py``
(row by row). To that end the sampling rows are processed with the very operations
``sampling.process_logits`` uses (sort-based top-k/top-p, ``torch.softmax``), batched with one parameter
per row. On a device they read nothing back but the two ``any()`` checks that skip the vocabulary
sorts when no request uses top-k or top-p. On the CPU, where the engine's steps run them and a read
costs nothing, the argmax goes through NumPy and the tree walk and the pool compaction work from host
lists: a step's trees are a few dozen nodes, where one vectorised torch op per tree level (or per pool
tensor over every slot) costs more than the work (``_walk`` and ``_compact_pool_device`` remain the
device versions; ``tests/kernels`` checks that both agree).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from lookupspec.sampling import (
    GREEDY_EPS,
    STREAM_ACCEPT,
    STREAM_RECOVER,
    accept_uniforms,
    exponential_from_keys,
    gumbel_from_keys,
    stream_keys,
)

from .tree_attention_reference import tree_attention
from .verify_inputs import BatchVerifyOutput, VerifyMode, check_verify_inputs

__all__ = ["argmax_rows", "compact_kv", "compact_pool", "process_rows", "tree_attention", "tree_mask",
           "verify_batch"]


def process_rows(
    logits: torch.Tensor,  # [R, vocab]
    temperature: torch.Tensor,  # [R] float32 (> 0 on the rows that matter)
    top_k: torch.Tensor,  # [R] int
    top_p: torch.Tensor,  # [R] float32
) -> torch.Tensor:
    """``sampling.process_logits`` with one parameter set per row, bit for bit. -> [R, vocab] float32."""
    scores = logits.float()
    vocab = scores.shape[-1]
    temp = temperature.to(scores.device, torch.float32).clamp_min(GREEDY_EPS)[:, None]
    # process_logits divides by a Python float. On CUDA torch turns a scalar divisor into a multiply by
    # its float32 reciprocal (div_true_kernel_cuda); on the CPU it divides. Mirror both.
    scores = scores * torch.reciprocal(temp) if scores.is_cuda else scores / temp
    k = top_k.to(scores.device, torch.int64)
    use_k = (k > 0) & (k < vocab)
    if bool(use_k.any()):
        ordered = torch.sort(scores, dim=-1, descending=True).values
        kth = torch.gather(ordered, -1, (k.clamp(1, vocab) - 1)[:, None])  # = topk(...).values[:, -1]
        scores = scores.masked_fill(use_k[:, None] & (scores < kth), float("-inf"))
    p = top_p.to(scores.device, torch.float32)
    use_p = p < 1.0
    if bool(use_p.any()):
        probs = torch.softmax(scores, dim=-1)
        sorted_probs, _ = torch.sort(probs, dim=-1, descending=True)
        exclusive = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        first = torch.searchsorted(-sorted_probs.contiguous(), -probs.contiguous(), side="left")
        mass_above = torch.gather(exclusive, -1, first)
        scores = scores.masked_fill(use_p[:, None] & (mass_above >= p[:, None]), float("-inf"))
    return scores


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``torch.argmax(x, dim=-1)``: the first index of each row's maximum, a NaN counting as the
    maximum. CPU float32 rows go through NumPy's argmax, which has the same semantics and measured
    10-15x faster than torch's CPU argmax on 49k-token rows (0.03 against 0.4 ms for 6 rows)."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() >= 1 and x.shape[-1] > 0:
        return torch.as_tensor(x.detach().numpy().argmax(axis=-1), dtype=torch.int64, device=x.device)
    return torch.argmax(x, dim=-1)


def _node_depths(global_parents: torch.Tensor, max_nodes: int) -> torch.Tensor:
    """Depth of every node by pointer jumping (no host sync). global_parents: [N] (-1 = root) -> [N]."""
    depth = torch.ones_like(global_parents)
    anc = global_parents.clone()
    for _ in range(max(1, math.ceil(math.log2(max(max_nodes, 1)))) + 1):
        has = anc >= 0
        a = anc.clamp(min=0)
        depth = depth + torch.where(has, depth[a], 0)
        anc = torch.where(has, anc[a], -1)
    return depth


def verify_batch(
    logits: torch.Tensor,  # [num_rows, vocab] bf16/fp16/fp32, each request's root row first
    tokens: torch.Tensor,  # [num_nodes] draft token of each node
    parents: torch.Tensor,  # [num_nodes] parent node index local to the request, -1 = root
    row_offsets: torch.Tensor,  # [B + 1] request b owns rows row_offsets[b] : row_offsets[b + 1]
    temperature: torch.Tensor | None = None,  # [B] float32 (0 = greedy)
    top_k: torch.Tensor | None = None,  # [B] int (0 = off)
    top_p: torch.Tensor | None = None,  # [B] float32 (1 = off)
    seed: torch.Tensor | None = None,  # [B] int64
    root_position: torch.Tensor | None = None,  # [B] int64 absolute position of each root token
    *,
    mode: VerifyMode | str,
    max_nodes: int,  # >= the largest number of nodes of a request; width of `accepted`
    draft_probs: torch.Tensor | None = None,  # [num_nodes, vocab] q of each sampled draft (rejection)
) -> BatchVerifyOutput:
    """Verify a batch of draft trees (kernels/verify_inputs.py: the layout; verify.py: the rules)."""
    mode = VerifyMode(mode)
    check_verify_inputs(logits, tokens, parents, row_offsets,
                        (temperature, top_k, top_p, seed, root_position), mode, max_nodes, draft_probs)
    dev = logits.device
    num_rows, vocab = logits.shape
    batch = row_offsets.numel() - 1
    num_nodes = tokens.numel()
    off = row_offsets.to(dev, torch.int64)
    tok = tokens.to(dev, torch.int64)
    par = parents.to(dev, torch.int64)
    if dev.type != "cuda" and batch and int((off[1:] - off[:-1]).max()) - 1 > max_nodes:  # no sync here
        raise ValueError(f"a request has more than max_nodes = {max_nodes} nodes")
    greedy_tok = argmax_rows(logits)  # [R]
    if mode is VerifyMode.GREEDY and dev.type == "cpu":
        return _walk_host(tok, par, off, greedy_tok, None, max_nodes)
    node_off = off - torch.arange(batch + 1, device=dev)
    rows = torch.arange(num_rows, device=dev)
    req = torch.searchsorted(off[1:], rows, right=True)  # [R] request of each row
    local = rows - off[req]  # [R] 0 = root row
    nodes = torch.arange(num_nodes, device=dev)
    nreq = torch.searchsorted(node_off[1:], nodes, right=True)  # [N] request of each node
    if (dev.type != "cuda" and mode is VerifyMode.REJECTION
            and not bool((par == nodes - node_off[nreq] - 1).all())):
        raise ValueError("rejection mode verifies chains: parents[i] must be i - 1 in every request")

    accept = torch.zeros(num_nodes, dtype=torch.bool, device=dev)
    if mode is VerifyMode.GREEDY:
        row_token = greedy_tok
    else:
        assert temperature is not None and top_k is not None and top_p is not None
        assert seed is not None and root_position is not None
        temp = temperature.to(dev, torch.float32)
        kk = top_k.to(dev, torch.int64)
        greedy_req = (temp < GREEDY_EPS) | (kk == 1)  # [B]
        greedy_row = greedy_req[req]
        if mode is VerifyMode.REJECTION:
            row_depth = local  # chains: the node of local row l sits at depth l
        else:
            gpar = torch.where(par >= 0, par + node_off[nreq], -1)
            depth = _node_depths(gpar, max_nodes)
            row_depth = torch.zeros(num_rows, dtype=torch.int64, device=dev)
            row_depth[nodes + nreq + 1] = depth
        positions = root_position.to(dev, torch.int64)[req] + row_depth + 1  # [R]
        row_seed = seed.to(dev, torch.int64)[req]
        # rows of greedy requests get a harmless temperature: their scores are never used
        scores = process_rows(logits, torch.where(greedy_row, 1.0, temp[req]), kk[req],
                              top_p.to(dev, torch.float32)[req])
        sampled = argmax_rows(scores + gumbel_from_keys(stream_keys(row_seed, positions), vocab))
        if mode is VerifyMode.MATCH:
            row_token = torch.where(greedy_row, greedy_tok, sampled)
        else:
            assert draft_probs is not None
            n_req = off[1:] - off[:-1] - 1
            has_child = local < n_req[req]  # [R] rows that decide a draft node (all but the last)
            child = (rows - req).clamp(max=max(num_nodes - 1, 0))  # [R] node decided by row (chain)
            probs = torch.softmax(scores, dim=-1)  # [R, vocab]
            if num_nodes > 0:
                q = draft_probs.to(dev, torch.float32)[child]  # [R, vocab]
                x = tok[child]
                px = probs[rows, x]
                qx = q[rows, x]
                u = accept_uniforms(stream_keys(row_seed, positions, STREAM_ACCEPT))
                row_accept = torch.where(greedy_row, x == greedy_tok, (px > 0) & (u * qx <= px))
                e = exponential_from_keys(stream_keys(row_seed, positions, STREAM_RECOVER), vocab)
                race = torch.clamp(probs - q, min=0.0) / e
                fallback = torch.argmax(probs / e, dim=-1)
                recovered = torch.where(race.max(dim=-1).values > 0, torch.argmax(race, dim=-1), fallback)
                accept = row_accept[nodes + nreq]  # node g is decided by the row before its own
            else:
                recovered = sampled
            row_token = torch.where(greedy_row, greedy_tok, torch.where(has_child, recovered, sampled))

    if dev.type == "cpu":
        passed = accept if mode is VerifyMode.REJECTION else None
        return _walk_host(tok, par, off, row_token, passed, max_nodes)
    if mode is not VerifyMode.REJECTION and num_nodes > 0:
        parent_row = torch.where(par >= 0, par + node_off[nreq] + nreq + 1, off[nreq])  # [N]
        accept = tok == row_token[parent_row]
    return _walk(accept, par, off, node_off, row_token, max_nodes)


def _walk_host(
    tok: torch.Tensor,  # [N] draft tokens
    par: torch.Tensor,  # [N] local parents
    off: torch.Tensor,  # [B + 1] row offsets
    row_token: torch.Tensor,  # [R] token emitted if the walk stops at this row
    accept: torch.Tensor | None,  # [N] bool (rejection), or None: a node is accepted when it equals
    max_nodes: int,  # its parent row's token
) -> BatchVerifyOutput:
    """:func:`_walk` on the host, for CPU tensors: the same outputs, from Python lists. A step's trees
    are a few dozen nodes, where one vectorised torch op per tree level costs more than the walk."""
    tokens, parents, offsets, row_tok = tok.tolist(), par.tolist(), off.tolist(), row_token.tolist()
    passed = None if accept is None else accept.tolist()
    batch = len(offsets) - 1
    path = [[-1] * max_nodes for _ in range(batch)]
    count, next_token, recovered = [0] * batch, [0] * batch, [False] * batch
    for b in range(batch):
        first_row, n = offsets[b], offsets[b + 1] - offsets[b] - 1
        first_node = first_row - b
        cur, steps = -1, 0
        while True:  # children of `cur` in index order: the first accepted one is the path's next node
            target = row_tok[first_row + cur + 1]
            nxt, has_child = -1, False
            for j in range(cur + 1, n):  # n <= max_nodes: checked by verify_batch
                if parents[first_node + j] != cur:
                    continue
                has_child = True
                if (tokens[first_node + j] == target) if passed is None else passed[first_node + j]:
                    nxt = j
                    break
            if nxt < 0:
                break
            path[b][steps] = nxt
            steps += 1
            cur = nxt
        count[b], next_token[b] = steps, row_tok[first_row + cur + 1]
        recovered[b] = has_child
    dev = tok.device
    return BatchVerifyOutput(torch.tensor(path, dtype=torch.int64, device=dev).reshape(batch, max_nodes),
                             torch.tensor(count, dtype=torch.int64, device=dev),
                             torch.tensor(next_token, dtype=torch.int64, device=dev),
                             torch.tensor(recovered, dtype=torch.bool, device=dev))


def _walk(
    accept: torch.Tensor,  # [N] bool: node equals its parent row's target (or passed rejection test)
    par: torch.Tensor,  # [N] local parents
    off: torch.Tensor,  # [B + 1] row offsets
    node_off: torch.Tensor,  # [B + 1] node offsets
    row_token: torch.Tensor,  # [R] token emitted if the walk stops at this row
    max_nodes: int,
) -> BatchVerifyOutput:
    """Walk every tree from its root down the first accepted child, vectorised over the batch."""
    dev = off.device
    on_gpu = dev.type == "cuda"
    batch = off.numel() - 1
    num_nodes = par.numel()
    j = torch.arange(max_nodes, device=dev)
    n_req = off[1:] - off[:-1] - 1  # [B]
    valid = j[None, :] < n_req[:, None]  # [B, M]
    if num_nodes > 0:
        g = (node_off[:-1, None] + j[None, :]).clamp(max=num_nodes - 1)
        par_p = torch.where(valid, par[g], -2)
        acc_p = valid & accept[g]
    else:
        par_p = torch.full((batch, max_nodes), -2, dtype=torch.int64, device=dev)
        acc_p = torch.zeros((batch, max_nodes), dtype=torch.bool, device=dev)
    cur = torch.full((batch,), -1, dtype=torch.int64, device=dev)
    done = torch.zeros(batch, dtype=torch.bool, device=dev)
    count = torch.zeros(batch, dtype=torch.int64, device=dev)
    path = torch.full((batch, max_nodes), -1, dtype=torch.int64, device=dev)
    for step in range(max_nodes):
        cand = acc_p & (par_p == cur[:, None])
        first = torch.where(cand, j[None, :], max_nodes).min(dim=1).values
        ok = (first < max_nodes) & ~done
        path[:, step] = torch.where(ok, first, -1)
        cur = torch.where(ok, first, cur)
        count += ok
        done |= ~ok
        if not on_gpu and bool(done.all()):  # free on the CPU; on a GPU it would be a sync per level
            break
    next_token = row_token[off[:-1] + cur + 1].to(torch.int64)
    recovered = (valid & (par_p == cur[:, None])).any(dim=1)
    return BatchVerifyOutput(path, count, next_token, recovered)


def tree_mask(
    parents: torch.Tensor,  # [n] parent index, -1 = attends only to the prefix (and itself)
    prefix_len: int,  # tokens already in the KV cache
    dtype: torch.dtype,  # the model's dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive tree attention mask [1, 1, n, prefix_len + n] (0 = visible: the whole prefix, the node
    itself and its ancestors; ``finfo(dtype).min`` elsewhere) and position ids [1, n] int64
    (``prefix_len + depth``, a node with parent -1 at depth 0).

    Example: parents [-1, 0, 0] (a root with two children), prefix 2 -> rows [0 0 0 m m],
    [0 0 0 0 m], [0 0 0 m 0]; positions [2, 3, 3]."""
    if parents.dim() != 1:
        raise ValueError(f"parents must be [n], got {tuple(parents.shape)}")
    dev = parents.device
    n = parents.numel()
    idx = torch.arange(n, device=dev)
    par = parents.to(torch.int64)
    # reach[i, j] = j is i or an ancestor of i: transitive closure by repeated squaring (n <= 2**24)
    reach = ((par[:, None] == idx[None, :]) | (idx[:, None] == idx[None, :])).float()
    for _ in range(math.ceil(math.log2(max(n, 2)))):
        reach = (reach @ reach).clamp(max=1.0)
    mask = torch.zeros((1, 1, n, prefix_len + n), dtype=dtype, device=dev)
    mask[0, 0, :, prefix_len:] = torch.where(reach > 0, 0.0, torch.finfo(dtype).min).to(dtype)
    positions = (prefix_len + reach.sum(dim=1).to(torch.int64) - 1)[None, :]
    return mask, positions


def compact_kv(
    kv: torch.Tensor,  # [batch, kv_heads, seq, head_dim] one layer's keys or values, edited in place
    accepted: torch.Tensor,  # [batch, max_nodes] accepted node indices, -1 padded (verify output)
    num_accepted: torch.Tensor,  # [batch]
    base: torch.Tensor | int,  # [batch] (or one int) cache position of draft node 0
) -> None:
    """Move the accepted nodes' entries from ``base + accepted[j]`` to ``base + j`` (j < num_accepted).

    Node indices on a path increase (a parent precedes its child), so ``accepted[j] >= j`` and no
    entry is overwritten before it is read. Entries from ``base + num_accepted`` on are left as they
    are: the caller crops the cache there."""
    if kv.dim() != 4 or accepted.dim() != 2 or accepted.shape[0] != kv.shape[0]:
        raise ValueError(f"kv must be [batch, heads, seq, dim] and accepted [batch, max_nodes], got "
                         f"{tuple(kv.shape)} and {tuple(accepted.shape)}")
    b, h, s, d = kv.shape
    m = accepted.shape[1]
    if m == 0 or s == 0:
        return
    dev = kv.device
    base_t = torch.as_tensor(base, device=dev, dtype=torch.int64).expand(b)[:, None]  # [B, 1]
    acc = accepted.to(dev, torch.int64)
    num = num_accepted.to(dev, torch.int64)[:, None]
    j = torch.arange(m, device=dev)[None, :]
    # Every destination in range gets the value it should hold afterwards; clamped duplicates (past
    # the end of the cache) carry identical values, so the scatter is deterministic.
    dst = (base_t + j).clamp(max=s - 1)  # [B, M]
    jd = dst - base_t
    moved = (jd >= 0) & (jd < num)
    src = torch.where(moved, base_t + torch.gather(acc, 1, jd.clamp(0, m - 1)), dst)
    vals = torch.gather(kv, 2, src[:, None, :, None].expand(b, h, m, d))
    kv.scatter_(2, dst[:, None, :, None].expand(b, h, m, d), vals)


def compact_pool(
    tensors: Sequence[torch.Tensor],  # the pool's [rows, slots, kv_heads, capacity, dim] tensors
    tensor_groups: Sequence[int],  # group of each tensor (the column of `base` it uses)
    table: torch.Tensor,  # [R, COLS] int64 row table (read by the Triton kernel only)
    slots: torch.Tensor,  # [B] int64
    base: torch.Tensor,  # [B, G] int64 entry of draft node 0 of each sequence in each group
    accepted: torch.Tensor,  # [B, M] accepted node indices, -1 padded
    num_accepted: torch.Tensor,  # [B]
) -> None:
    """:func:`compact_kv` over every row of every pool tensor, for the step's slots (the other slots
    get ``num_accepted = 0``: nothing moves). Works on the tensors themselves, not the row table."""
    b, m = accepted.shape
    if m == 0 or b == 0:
        return
    if accepted.device.type == "cpu":
        _compact_pool_host(tensors, tensor_groups, slots, base, accepted, num_accepted)
        return
    _compact_pool_device(tensors, tensor_groups, slots, base, accepted, num_accepted)


def _compact_pool_host(tensors: Sequence[torch.Tensor], tensor_groups: Sequence[int], slots: torch.Tensor,
                       base: torch.Tensor, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """:func:`compact_pool` for CPU tensors: the moves read on the host, then one copy per tensor and
    sequence whose path moves, over the sequence's own slot only (a chain moves nothing)."""
    paths, counts, slot_list, bases = accepted.tolist(), num_accepted.tolist(), slots.tolist(), base.tolist()
    for t, g in zip(tensors, tensor_groups, strict=True):
        capacity = t.shape[3]
        for path, count, slot, starts in zip(paths, counts, slot_list, bases, strict=True):
            start = starts[g]
            moves = [(start + j, start + a) for j, a in enumerate(path[:count])
                     if a != j and start + j < capacity]
            if moves:
                view = t[:, slot]  # [rows, kv_heads, capacity, dim]
                dst, src = (torch.tensor(x, dtype=torch.int64, device=t.device)
                            for x in zip(*moves, strict=True))
                view[:, :, dst] = view[:, :, src]


def _compact_pool_device(tensors: Sequence[torch.Tensor], tensor_groups: Sequence[int], slots: torch.Tensor,
                         base: torch.Tensor, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """:func:`compact_pool` without reading anything back: :func:`compact_kv` over every row and slot."""
    m = accepted.shape[1]
    for t, g in zip(tensors, tensor_groups, strict=True):
        rows, n_slots = t.shape[0], t.shape[1]
        dev = t.device
        acc = torch.full((n_slots, m), -1, dtype=torch.int64, device=dev)
        num = torch.zeros(n_slots, dtype=torch.int64, device=dev)
        start = torch.zeros(n_slots, dtype=torch.int64, device=dev)
        acc[slots] = accepted.to(torch.int64)
        num[slots] = num_accepted.to(torch.int64)
        start[slots] = base[:, g]
        compact_kv(t.view(rows * n_slots, *t.shape[2:]), acc.repeat(rows, 1), num.repeat(rows),
                   start.repeat(rows))
