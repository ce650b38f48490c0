"""Warm-up of an :class:`~lookupspec.engine.Engine` before it serves: every compiled kernel variant a
step can use is launched once (so no request pays a compile), and the step-cost model is seeded with
measured forwards (so the drafting policy's first choices rest on this machine's costs)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from lookupspec import kernels
from lookupspec.index import ContextIndex
from lookupspec.runtime import SeqRows
from lookupspec.sampling import SamplingParams

if TYPE_CHECKING:
    from lookupspec.engine import Engine

__all__ = ["sync_device", "warm_drafting", "warm_kernels", "warm_up"]


def warm_up(engine: Engine, sizes: Sequence[int], batches: Sequence[int], context: int) -> None:
    """Seed the step cost model with measured forwards on dummy contexts: one sequence over each
    of ``sizes`` rows, and ``batches`` sequences of 1 and 4 rows each. Each shape runs once
    untimed first: the first forward of a new shape pays one-time set-up costs that would otherwise
    read as a very expensive step and switch speculation off; on CUDA every timing is taken between
    two synchronisations. Before that it launches every verification and compaction kernel variant
    a step can use (:func:`warm_kernels`), so that no compile lands in a request's step or in
    the cost model, and the lookup drafter's numba kernels (:func:`warm_drafting`)."""
    warm_drafting()
    sizes = [n for n in sizes if n + 2 < engine.context_window]
    context = max(1, min(context, engine.context_window - max(sizes, default=1) - 2))
    shapes = [(1, n) for n in sizes] + [(b, r) for b in batches if b > 1 for r in (1, 4)]
    nb = min(max(b for b, _ in shapes), engine.runner.pool.max_slots)
    slots = []
    try:
        with torch.inference_mode():
            step = engine.runner.pool.max_rows  # the most rows a forward may give a slot
            for j in range(nb):
                slots.append(engine.runner.allocate(context + max(sizes, default=1) + 2))
                ids = [(i + j) % engine.vocab_size for i in range(context)]
                for at in range(0, context, step):
                    engine.runner.prefill(slots[-1], ids[at:at + step])
            warm_kernels(engine, slots[0], context)
            for b, r in shapes:
                rows = [SeqRows(slot, [7 % engine.vocab_size] * r) for slot in slots[:b]]
                times = []
                for _ in range(3):
                    sync_device(engine.device)  # time the forward, not the launches queued before it
                    t0 = time.perf_counter()
                    logits = engine.runner.forward(rows)
                    sync_device(engine.device)  # ... and not only its launch (CUDA runs asynchronously)
                    times.append(time.perf_counter() - t0)
                    del logits
                    for slot in slots[:b]:
                        engine.runner.pool.truncate(slot, context)
                engine.drafting.observe_step([r] * len(rows), [context] * len(rows), min(times[1:]))
    finally:
        for slot in slots:
            engine.runner.free(slot)


def warm_drafting() -> None:
    """Compile (or load from numba's cache) the prompt index's kernels, which every request's lookup
    session builds on. Without this the first request after a fresh install paid the compile:
    25.7 of a 27.9-s first 64-token request on the H200's host after ``TextEngine.load(...,
    warmup=True)`` (2026-11-28; 1.6-1.8 s for the next ones)."""
    ContextIndex()  # its constructor warms the kernels, once per process


def sync_device(device: torch.device) -> None:
    """Wait until ``device`` has run everything queued on it (CUDA runs kernels asynchronously; the
    CPU has nothing to wait for): what a timer around a forward needs on both sides."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_kernels(engine: Engine, slot: int, context: int) -> None:
    """Launch every compiled kernel variant a step can use, so that no request pays a compile:
    each verification mode (rejection only with a draft model) for every walk block size the
    tree sizes ``0 .. max_draft_tokens`` of the engine's default spec map to, and the KV
    compaction for every path-width block. The per-step integers of the kernels are not
    specialised on (``kernels.variants``), so these are all the variants. Requests that ask for
    larger trees than the default spec compile their block sizes on first use."""
    max_nodes = engine.default_spec.max_draft_tokens
    blocks = sorted({1 << max(0, (n - 1).bit_length()) for n in range(1, max_nodes + 1)} | {1})
    modes = ["greedy", "match"] + (["rejection"] if engine.draft_model is not None else [])
    logits_dtype = torch.float32 if engine.dtype == torch.float32 else engine.dtype
    sampling = SamplingParams(temperature=0.5, seed=0)  # sampled rows: the path the modes differ in
    for n in [0, *blocks] if max_nodes else [0]:
        n = min(n, max_nodes)
        logits = torch.zeros((n + 1, engine.vocab_size), dtype=logits_dtype, device=engine.device)
        packed = kernels.pack_requests([([0] * n, list(range(-1, n - 1)))], [sampling], [context],
                                       device=engine.device)
        for mode in modes:
            probs = (torch.full((n, engine.vocab_size), 1.0 / engine.vocab_size, dtype=torch.float32,
                                device=engine.device) if mode == "rejection" else None)
            kernels.verify_batch(logits, **packed._asdict(), mode=mode, draft_probs=probs, checked=True)
        if n:  # an accepted path of width n: nothing moves (num_accepted 0), every block size compiles
            path = torch.full((1, n), -1, dtype=torch.int64, device=engine.device)
            engine.runner.pool.compact([slot], path, torch.zeros(1, dtype=torch.int64, device=engine.device),
                                     [context])
    sync_device(engine.device)
