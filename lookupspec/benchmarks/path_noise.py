"""How far a position's logits move between the runtime's forward paths: bench-batch's ``noise``.

The same position can be computed as a one-row decode step, as a row of a draft chain or tree
verified in one forward, among other sequences' rows, or as the last row of a prefill. Where every
product and attention row is computed the same way whatever the row count (the CPU's float32
runtime: the streaming matmul and the native attention), all of these give the same bits. Elsewhere
(bfloat16 on a GPU, where cuBLAS picks kernels by shape) they may differ by rounding, and a token
whose two best candidates are closer than twice that difference may be chosen differently by a
batch of 8 (smaller draft trees, so other row counts) than by a batch of 1. This module measures the
difference on real prompts, so that bench-batch's exactness section can state its near-tie epsilon
from it instead of from a float32 figure.

For each prompt: ``head`` (all but its last ``k`` tokens) is prefilled, then the last ``k`` tokens
are fed one row at a time (the reference); then, each in a fresh slot after the same head, as one
chain of ``k`` rows, as that chain inside a tree with sibling rows, as that chain among other
sequences' one-row steps, and as a prefill of head + chain (its last row only). Each path's rows are
compared with the reference rows: the largest absolute difference, the largest in steps of the
model's dtype at the row's largest logit, the rows bit-identical and the rows whose argmax agrees.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["PATHS", "dtype_step", "dtype_steps", "noise_epsilon", "path_noise"]

PATHS = ("chain", "tree", "batched", "prefill")


def dtype_step(value: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype``'s values at ``|value|``: bfloat16's is 0.125 between 16 and 32, where
    float32's is 2**-19. A margin in these steps says how many roundings apart two candidates were."""
    import math

    finfo = torch.finfo(dtype)
    magnitude = abs(value)
    if magnitude < finfo.tiny:
        return float(finfo.tiny) * finfo.eps
    return finfo.eps * 2.0 ** math.floor(math.log2(magnitude))


def noise_epsilon(rows: Sequence[dict[str, Any]], floor: float) -> float:
    """The near-tie epsilon in logits that ``rows`` (:func:`path_noise`'s) support: twice the largest
    difference between paths (each of two candidates' logits may move that much), at least
    ``floor``."""
    return max([floor] + [2.0 * r["max_abs"] for r in rows])


def dtype_steps(reference: torch.Tensor, other: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each row's largest |other - reference| in steps of ``dtype`` at the row's largest reference
    value (the size of its top candidates, where a near-tie is decided): [rows] from [rows, vocab]
    float32 tensors."""
    finfo = torch.finfo(dtype)
    _, exponent = torch.frexp(reference.abs().amax(-1).clamp_min(finfo.tiny))
    step = finfo.eps * torch.pow(2.0, (exponent - 1).to(torch.float32))
    return (other - reference).abs().amax(-1) / step


def _rows(runner: Any, head: list[int], tail: list[int], path: str,
          neighbours: list[list[int]]) -> torch.Tensor:
    """``tail``'s rows' logits [k, vocab] (float32) after ``head`` along ``path`` (the reference
    path, one row a forward, is ``"one"``; ``"prefill"`` gives only the last row, [1, vocab])."""
    from lookupspec.runtime import SeqRows

    k = len(tail)
    slot = runner.allocate(len(head) + k + 4)
    others: list[int] = []
    try:
        if path == "prefill":
            return runner.prefill(slot, head + tail)[None].float()
        runner.prefill(slot, head)
        if path == "one":
            return torch.stack([runner.forward([SeqRows(slot, [t])])[-1].float() for t in tail])
        if path == "chain":
            return runner.forward([SeqRows(slot, tail)]).float()
        if path == "tree":  # the chain, then three siblings hanging off its first rows
            tokens = [*tail, tail[0], tail[-1], head[-1]]
            parents = [-1, *range(k - 1), -1, 0, min(1, k - 1) if k > 1 else -1]
            return runner.forward([SeqRows(slot, tokens, parents)])[:k].float()
        if path == "batched":  # among other sequences' one-row steps, before and after it
            seqs = []
            for ids in neighbours:
                s = runner.allocate(len(ids) + 2)
                others.append(s)
                runner.prefill(s, ids[:-1])
                seqs.append(SeqRows(s, ids[-1:]))
            half = len(seqs) // 2
            logits = runner.forward([*seqs[:half], SeqRows(slot, tail), *seqs[half:]])
            return logits[half:half + k].float()
        raise ValueError(f"unknown path {path!r}")
    finally:
        runner.free(slot)
        for s in others:
            runner.free(s)


def path_noise(runner: Any, prompts: Sequence[Sequence[int]], rows: Sequence[int] = (4, 16),
               neighbours: int = 7, neighbour_tokens: int = 48) -> list[dict[str, Any]]:
    """One row per (path, chain length): how far that path's logits are from the one-row reference
    over ``prompts`` (see the module docstring). ``neighbours`` other sequences of
    ``neighbour_tokens`` tokens (cut from the prompts) share the batched path's forward."""
    lists = [list(p) for p in prompts]
    dtype = runner.dtype
    pool = [p[:neighbour_tokens] for p in lists if len(p) >= 2]
    others = [pool[i % len(pool)] for i in range(neighbours)] if pool else []
    out = []
    for k in rows:
        stats = {p: {"rows": 0, "identical": 0, "argmax_agree": 0, "max_abs": 0.0, "max_steps": 0.0}
                 for p in PATHS}
        for prompt in lists:
            if len(prompt) < k + 2:
                continue
            head, tail = prompt[:-k], prompt[-k:]
            reference = _rows(runner, head, tail, "one", others)
            for path in PATHS:
                got = _rows(runner, head, tail, path, others)
                ref = reference[-1:] if path == "prefill" else reference
                s = stats[path]
                s["rows"] += len(ref)
                s["identical"] += sum(bool(torch.equal(a, b)) for a, b in zip(ref, got, strict=True))
                s["argmax_agree"] += int((ref.argmax(-1) == got.argmax(-1)).sum())
                s["max_abs"] = max(s["max_abs"], float((got - ref).abs().max()))
                s["max_steps"] = max(s["max_steps"], float(dtype_steps(ref, got, dtype).max()))
        for path, s in stats.items():
            if s["rows"]:
                out.append({"path": path, "chain": k, "rows": s["rows"], "identical_rows": s["identical"],
                            "argmax_agree": s["argmax_agree"], "max_abs": round(s["max_abs"], 6),
                            "max_dtype_steps": round(s["max_steps"], 2)})
    return out
