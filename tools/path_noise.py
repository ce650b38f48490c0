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
are fed one row at a time (the reference); then, each after the same head (the previous path's rows
cut off the cache again), as one chain of ``k`` rows, as that chain inside a tree with sibling rows,
and as that chain among other sequences' one-row steps; and, in a fresh slot, as a prefill of head +
chain (its last row only). Each path's rows are compared with the reference rows: the largest
absolute difference, the largest in steps of the model's dtype at the row's largest logit, the rows
bit-identical and the rows whose argmax agrees.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["PATHS", "dtype_step", "dtype_steps", "noise_epsilon", "path_noise"]

PATHS = ("chain", "tree", "batched", "prefill")


def _spacing(magnitude: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s values at each ``magnitude`` (>= 0; under the smallest normal
    number, the spacing there)."""
    finfo = torch.finfo(dtype)
    _, exponent = torch.frexp(magnitude.clamp_min(finfo.tiny))
    return finfo.eps * torch.pow(2.0, (exponent - 1).to(torch.float64))


def dtype_step(value: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype``'s values at ``|value|``: bfloat16's is 0.125 between 16 and 32, where
    float32's is 2**-19. A margin in these steps says how many roundings apart two candidates were."""
    return float(_spacing(torch.tensor(abs(value), dtype=torch.float64), dtype))


def noise_epsilon(rows: Sequence[dict[str, Any]], floor: float) -> float:
    """The near-tie epsilon in logits that ``rows`` (:func:`path_noise`'s) support: twice the largest
    difference between paths (each of two candidates' logits may move that much), at least
    ``floor``."""
    return max([floor] + [2.0 * r["max_abs"] for r in rows])


def dtype_steps(reference: torch.Tensor, other: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each row's largest |other - reference| in steps of ``dtype`` at the row's largest reference
    value (the size of its top candidates, where a near-tie is decided): [rows] from [rows, vocab]
    float32 tensors."""
    step = _spacing(reference.abs().amax(-1).double(), dtype)
    return ((other - reference).abs().amax(-1).double() / step).float()


def _paths(runner: Any, head: list[int], tail: list[int],
           neighbours: list[list[int]]) -> dict[str, torch.Tensor]:
    """``tail``'s rows' logits [k, vocab] (float32) after ``head`` along each path and along the
    reference, one row a forward (``"one"``); ``"prefill"`` holds only the last row, [1, vocab].
    ``head`` is prefilled once: each path's rows are cut off the cache again after its forward."""
    from lookupspec.runtime import SeqRows

    k = len(tail)
    slots = [runner.allocate(len(head) + k + 4)]
    slot = slots[0]

    def rows(logits: torch.Tensor) -> torch.Tensor:
        runner.pool.truncate(slot, len(head))  # back to the head alone for the next path
        return logits.float()

    try:
        runner.prefill(slot, head)
        out = {"one": rows(torch.stack([runner.forward([SeqRows(slot, [t])])[-1] for t in tail])),
               "chain": rows(runner.forward([SeqRows(slot, tail)]))}
        # the chain, then three siblings hanging off its first rows
        tokens = [*tail, tail[0], tail[-1], head[-1]]
        parents = [-1, *range(k - 1), -1, 0, min(1, k - 1) if k > 1 else -1]
        out["tree"] = rows(runner.forward([SeqRows(slot, tokens, parents)])[:k])
        seqs = []  # the chain among other sequences' one-row steps, before and after it
        for ids in neighbours:
            slots.append(runner.allocate(len(ids) + 2))
            runner.prefill(slots[-1], ids[:-1])
            seqs.append(SeqRows(slots[-1], ids[-1:]))
        half = len(seqs) // 2
        batched = runner.forward([*seqs[:half], SeqRows(slot, tail), *seqs[half:]])
        out["batched"] = rows(batched[half:half + k])
        slots.append(runner.allocate(len(head) + k + 4))
        out["prefill"] = runner.prefill(slots[-1], head + tail)[None].float()
        return out
    finally:
        for s in slots:
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
            logits = _paths(runner, prompt[:-k], prompt[-k:], others)
            for path in PATHS:
                got, ref = logits[path], logits["one"][-len(logits[path]):]
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
