"""The batched verification interface shared by the Triton kernels and their torch twins.

A batch is a flat list of draft trees. Request ``b`` owns logits rows
``row_offsets[b] : row_offsets[b + 1]``, root row first (``n_b + 1`` rows for ``n_b`` draft nodes,
``n_b = 0`` being a plain decode step), and draft nodes ``row_offsets[b] - b : row_offsets[b + 1] - b - 1``
of ``tokens`` / ``parents`` (parents are local to the request, -1 = the root). Example, two requests
with 2 and 0 nodes: ``row_offsets = [0, 3, 4]``, rows 0-2 and 3, nodes 0-1 and none.

:func:`pack_requests` builds these tensors from Python lists and ``SamplingParams`` with one
host-to-device copy; :func:`stage_requests` adds them to a step's :class:`~.staging.HostStage`
instead, so that they travel with the step's other inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import NamedTuple

import numpy as np
import torch

from lookupspec.sampling import SamplingParams
from lookupspec.verify import NextKind, VerifyResult

from .staging import HostStage, Staged

__all__ = [
    "BatchVerifyOutput",
    "RequestBatch",
    "StagedRequests",
    "VerifyMode",
    "check_batch_parents",
    "check_tree_parents",
    "check_verify_inputs",
    "pack_requests",
    "stage_requests",
]


class VerifyMode(StrEnum):
    """Batch-wide verification rule. In ``match`` and ``rejection`` a request whose parameters are
    greedy (temperature < GREEDY_EPS or top_k == 1) is verified with the greedy rule."""

    GREEDY = "greedy"  # every request greedy; sampling tensors may be None
    MATCH = "match"  # sample-and-match for deterministic draft trees
    REJECTION = "rejection"  # rejection sampling of sampled chains; needs draft_probs


class BatchVerifyOutput(NamedTuple):
    accepted: torch.Tensor  # [B, max_nodes] int64 accepted node indices (local), root side first, -1 pad
    num_accepted: torch.Tensor  # [B] int64
    next_token: torch.Tensor  # [B] int64 the recovered or bonus token
    recovered: torch.Tensor  # [B] bool: True = recovered token, False = bonus token

    def results(self) -> list[VerifyResult]:
        """Per-request results on the host (one device-to-host copy of all four tensors)."""
        columns = [self.num_accepted, self.next_token, self.recovered]
        packed = torch.cat([self.accepted.to(torch.int64), *(c.to(torch.int64)[:, None] for c in columns)],
                           dim=1).tolist()  # [B, max_nodes + 3]
        out = []
        for row in packed:
            acc, (num, nxt, rec) = row[:-3], row[-3:]
            out.append(VerifyResult(tuple(acc[:num]), nxt, NextKind.RECOVERED if rec else NextKind.BONUS))
        return out


class RequestBatch(NamedTuple):
    """Keyword arguments of ``verify_batch`` besides logits, mode and draft_probs."""

    tokens: torch.Tensor  # [num_nodes] int32
    parents: torch.Tensor  # [num_nodes] int32, local, -1 = root
    row_offsets: torch.Tensor  # [B + 1] int32
    temperature: torch.Tensor  # [B] float32, 0.0 for greedy requests
    top_k: torch.Tensor  # [B] int32
    top_p: torch.Tensor  # [B] float32
    seed: torch.Tensor  # [B] int64
    root_position: torch.Tensor  # [B] int64
    max_nodes: int


def check_tree_parents(parents: Sequence[int] | np.ndarray, num_nodes: int | None = None) -> None:
    """Host check of one draft tree's parents, before any kernel walks them: every parent is -1 (the
    root) or an earlier node (``-1 <= parents[i] < i``), so the tree has no cycle and no node is
    deeper than its index; and there is one parent per node (``num_nodes``). A malformed array would
    otherwise send the kernels' ancestor walks out of the tree. Raises ValueError.

    Example: [-1, 0, 0, 2] is a tree (depths 1, 2, 2, 3); [-1, 2, 1] (a cycle) and [0] are not."""
    par = np.asarray(parents, dtype=np.int64).reshape(-1)
    if num_nodes is not None and par.size != num_nodes:
        raise ValueError(f"a tree of {num_nodes} nodes needs {num_nodes} parents, got {par.size}")
    bad = np.flatnonzero((par < -1) | (par >= np.arange(par.size)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"malformed draft tree: parents[{i}] = {int(par[i])}; a parent must be -1 (the "
                         f"root) or an earlier node (< {i})")


def check_batch_parents(parents: torch.Tensor, row_offsets: torch.Tensor, max_nodes: int) -> None:
    """:func:`check_tree_parents` for every request of a batch whose layout lives on the host (CPU
    tensors; checking device tensors would synchronise, so the engine checks its lists before packing
    and the kernels bound their walks by the tree size instead)."""
    if parents.device.type != "cpu" or row_offsets.device.type != "cpu":
        return
    par = parents.numpy().astype(np.int64)
    off = row_offsets.numpy().astype(np.int64)
    if off.size < 1 or off[0] != 0 or np.any(np.diff(off) < 1) or off[-1] - (off.size - 1) != par.size:
        raise ValueError(f"row_offsets {off.tolist()} do not describe {par.size} nodes (one root row per "
                         "request, increasing)")
    for b in range(off.size - 1):
        n = int(off[b + 1] - off[b] - 1)
        if n > max_nodes:
            raise ValueError(f"request {b} has {n} nodes, more than max_nodes = {max_nodes}")
        start = int(off[b] - b)
        check_tree_parents(par[start:start + n], n)


class StagedRequests(NamedTuple):
    """:func:`stage_requests`' pieces; :meth:`batch` once the stage is uploaded."""

    pieces: tuple[Staged, ...]  # the RequestBatch tensors in field order, max_nodes excluded
    max_nodes: int

    def batch(self) -> RequestBatch:
        tok, par, off, temp, top_k, top_p, seed, root = (p.tensor for p in self.pieces)
        return RequestBatch(tok, par, off, temp, top_k, top_p, seed, root, self.max_nodes)


def stage_requests(
    trees: Sequence[tuple[Sequence[int], Sequence[int]]],  # per request: (tokens, parents)
    params: Sequence[SamplingParams],
    root_positions: Sequence[int],
    stage: HostStage,
) -> StagedRequests:
    """Flatten per-request draft trees and sampling parameters into the batched layout, as pieces of
    ``stage`` (moved to the device with the rest of the step's inputs). Checks every tree's parents
    (:func:`check_tree_parents`).

    Greedy requests get temperature 0 so that every implementation agrees on which rows are greedy."""
    if not len(trees) == len(params) == len(root_positions):
        raise ValueError("trees, params and root_positions must have one entry per request")
    toks: list[int] = []
    pars: list[int] = []
    offsets = [0]
    for tree_tokens, tree_parents in trees:
        if len(tree_tokens) != len(tree_parents):
            raise ValueError("each tree needs as many parents as tokens")
        check_tree_parents(tree_parents, len(tree_tokens))
        toks.extend(int(t) for t in tree_tokens)
        pars.extend(int(p) for p in tree_parents)
        offsets.append(offsets[-1] + len(tree_tokens) + 1)
    for p in params:
        if not p.greedy and p.seed is None:
            raise ValueError("sampling needs a concrete seed: call SamplingParams.with_seed() first")
    pieces = (
        stage.add(np.asarray(toks, np.int32), torch.int32),  # int32: what the kernels read
        stage.add(np.asarray(pars, np.int32), torch.int32),
        stage.add(np.asarray(offsets, np.int32), torch.int32),
        stage.add(np.asarray([0.0 if p.greedy else p.temperature for p in params], np.float32),
                  torch.float32),
        stage.add(np.asarray([p.top_k for p in params], np.int32), torch.int32),
        stage.add(np.asarray([p.top_p for p in params], np.float32), torch.float32),
        stage.add(np.asarray([0 if p.seed is None else p.seed for p in params], np.int64), torch.int64),
        stage.add(np.asarray([int(r) for r in root_positions], np.int64), torch.int64),
    )
    return StagedRequests(pieces, max((len(tr[0]) for tr in trees), default=0))


def pack_requests(
    trees: Sequence[tuple[Sequence[int], Sequence[int]]],  # per request: (tokens, parents)
    params: Sequence[SamplingParams],
    root_positions: Sequence[int],
    device: torch.device | str = "cpu",
) -> RequestBatch:
    """:func:`stage_requests` on a stage of its own, moved to ``device`` in one copy."""
    stage = HostStage(device)
    staged = stage_requests(trees, params, root_positions, stage)
    stage.upload()
    return staged.batch()


def check_verify_inputs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    row_offsets: torch.Tensor,
    sampling: Sequence[torch.Tensor | None],  # temperature, top_k, top_p, seed, root_position
    mode: VerifyMode,
    max_nodes: int,
    draft_probs: torch.Tensor | None,
) -> None:
    """Cheap checks of dims and dtypes (never of values: that would synchronise with the device)."""
    if logits.dim() != 2 or logits.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"logits must be [num_rows, vocab] fp32/fp16/bf16, got {tuple(logits.shape)} "
                         f"{logits.dtype}")
    for name, x in (("tokens", tokens), ("parents", parents), ("row_offsets", row_offsets)):
        if x.dim() != 1 or x.dtype.is_floating_point or x.dtype == torch.bool:
            raise ValueError(f"{name} must be a 1-D integer tensor, got {tuple(x.shape)} {x.dtype}")
    if tokens.shape != parents.shape:
        raise ValueError(f"tokens and parents differ in shape: {tuple(tokens.shape)} {tuple(parents.shape)}")
    batch = row_offsets.numel() - 1
    if batch < 1:
        raise ValueError("row_offsets must hold at least two entries (one request)")
    if tokens.numel() != logits.shape[0] - batch:
        raise ValueError(f"{logits.shape[0]} logits rows for {batch} requests need "
                         f"{logits.shape[0] - batch} nodes, got {tokens.numel()}")
    if max_nodes < 0:
        raise ValueError(f"max_nodes must be >= 0, got {max_nodes}")
    if mode is not VerifyMode.GREEDY:
        names = ("temperature", "top_k", "top_p", "seed", "root_position")
        for name, value in zip(names, sampling, strict=True):
            if value is None or value.shape != (batch,):
                raise ValueError(f"mode {mode.value!r} needs {name} as a [{batch}] tensor")
    if mode is VerifyMode.REJECTION:
        if draft_probs is None or draft_probs.shape != (tokens.numel(), logits.shape[1]):
            raise ValueError(f"rejection mode needs draft_probs [num_nodes, vocab] = "
                             f"[{tokens.numel()}, {logits.shape[1]}]")
        if not draft_probs.dtype.is_floating_point:
            raise ValueError(f"draft_probs must be floating point, got {draft_probs.dtype}")
