"""Warm-up, in one place: whatever a first request would otherwise pay for runs here, before serving.

- :func:`warm_numba`: the numba kernels of the token indexes and of drafting, compiled (or loaded
  from numba's disk cache) once per process. The index stores and the composer call their part at
  construction (:func:`warm_context_index`, :func:`warm_corpus_index`, :func:`warm_drafting`), so no
  kernel is compiled mid-request; `make serve` and `make test` call :func:`warm_numba` beside
  ``lookupspec pull`` so that the caches exist before the server and the test workers need them.
- :func:`warm_native`: the C kernels of the CPU runtime, built into the kernel cache; `make serve`
  and `make test` call it beside the pull too.
- :func:`warm_kernels`: every Triton kernel variant a step can launch (verification, KV compaction).
- :func:`warm_up`: an engine before it serves: the above, the CUDA graphs of the static step's
  common buckets where it serves (:mod:`lookupspec.runtime.static.serving`), then measured forwards
  that seed the step cost model (:mod:`lookupspec.cost`) so the drafting policy's first choices rest
  on this machine's costs. ``Engine.warmup`` and ``TextEngine.load(..., warmup=True)`` call it.
- :func:`warm_text`: a text engine's first request: a short generation, the prompt byte bound and a
  chat prompt through the template and the tokenizer.

Nothing is compiled at import: this module imports only the standard library at module level (the
stores and the composer import it), and each warm-up imports what it runs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from lookupspec.engine import Engine

__all__ = ["sync_device", "warm_context_index", "warm_corpus_index", "warm_drafting", "warm_kernels",
           "warm_native", "warm_numba", "warm_text", "warm_up"]

_done: set[str] = set()  # the numba warm-ups run so far in this process


def _first(name: str) -> bool:
    """True the first time ``name`` is asked for (marked before it runs: the warm-ups construct the
    stores whose constructors ask again)."""
    if name in _done:
        return False
    _done.add(name)
    return True


def warm_numba() -> None:
    """Compile (or load from numba's cache) every numba kernel of the index and drafting modules. On
    a fresh install a process that reaches a kernel before its cache file exists compiles it (tens
    of seconds of one core for all of them); loading them all from the cache takes about a second."""
    warm_context_index()
    warm_corpus_index()
    warm_drafting()


def warm_native() -> None:
    """Build (or find in the kernel cache) the runtime's C kernels for this CPU, as the settings ask
    (:mod:`lookupspec.runtime.native.loader`): about half a minute of one core on a fresh machine,
    which would otherwise land in the first model load of every process that shares no cache."""
    from lookupspec.runtime.native import attention, layer_ops, matmul

    for lib in (matmul, attention, layer_ops):
        lib.kernel()


def warm_context_index() -> None:
    """The prompt index's kernels (:class:`~lookupspec.index.ContextIndex`, one per request): append,
    lookup, and the rehash of a table that fills."""
    if not _first("context"):
        return
    import numpy as np

    from lookupspec.index.context import ContextIndex
    from lookupspec.index.lookup import LookupConfig

    s = ContextIndex(max_ngram=2)
    s.extend(np.array([1, 2, 1, 2, 3, 1], np.int32))
    s.lookup(np.array([1, 2], np.int32), LookupConfig(max_match=4, max_depth=4))
    s.extend(np.arange(200, dtype=np.int32))  # past the first table's load: a rehash


def warm_corpus_index() -> None:
    """The segment indexes' kernels (corpus and output indexes): build, merge, lookup, delete and a
    payload's round trip."""
    if not _first("corpus"):
        return
    import numpy as np

    from lookupspec.index.lookup import LookupConfig
    from lookupspec.index.segments import SegmentSet

    s = SegmentSet(auto_merge=True)
    s.add([("a", np.array([1, 2, 3, 1, 2] * 20, np.int32)), ("b", np.array([1, 2, 4], np.int32))])
    s.add([("c", np.array([2, 3], np.int32))])
    s.lookup(np.array([1, 2], np.int32), LookupConfig(max_match=2, max_depth=2))
    s.delete(["b"])
    meta, arrays = s.to_payload()
    SegmentSet.from_payload(meta, arrays)


def warm_drafting() -> None:
    """The composer's merge of candidate trees (chains and trees) and the lookup drafter's node
    scoring: every request's lookup session runs both each step."""
    if not _first("drafting"):
        return
    import numpy as np

    from lookupspec.drafting.composer import _compose
    from lookupspec.drafting.scoring import PROB_CAP, score_nodes

    f = np.empty(2, np.float32)
    score_nodes(np.array([-1, 0], np.int32), np.array([2, 1], np.int64), np.array([1, 2], np.int32), 3,
                np.ones(3, np.float32), PROB_CAP, f, f.copy(), f.copy())
    nodes = np.array([[5, 6, 5], [-1, 0, -1], [2, 1, 1], [0, 1, 0], [1, 2, 1]], np.int64)
    est = np.zeros((2, 3), np.float32)
    cands = np.array([[0, 2, 2, 3, 0, 0], [2, 1, 3, 1, 1, 1]], np.int64)
    for chain in (False, True):
        _compose(nodes, est, cands, np.ones((2, 3), np.float32), 3, np.float32(0.0), chain,
                 np.float32(PROB_CAP), np.empty(64, np.int64), np.empty(8, np.float32))


def warm_up(engine: Engine, sizes: Sequence[int], batches: Sequence[int], context: int) -> None:
    """Seed the step cost model with measured forwards on dummy contexts: one sequence over each
    of ``sizes`` rows, and ``batches`` sequences of 1 and 4 rows each. Each shape runs once
    untimed first: the first forward of a new shape pays one-time set-up costs that would otherwise
    read as a very expensive step and switch speculation off; on CUDA every timing is taken between
    two synchronisations. Before that it launches every verification and compaction kernel variant
    a step can use (:func:`warm_kernels`), so that no compile lands in a request's step or in
    the cost model, and the numba kernels every request's lookup session runs (:func:`warm_numba`);
    where the static step serves, it captures the graphs of the common buckets (after the dummy
    prefills, which may grow the KV pool: a graph holds the pool's addresses)."""
    import torch

    from lookupspec.runtime import SeqRows

    warm_numba()
    sizes = [n for n in sizes if n + 2 < engine.context_window]
    context = max(1, min(context, engine.context_window - max(sizes, default=1) - 2))
    shapes = [(1, n) for n in sizes] + [(b, r) for b in batches if b > 1 for r in (1, 4)]
    nb = min(max(b for b, _ in shapes), engine.runner.max_batch)
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
            if engine.runner.static is not None:
                engine.runner.static.capture(engine.runner.max_batch)
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
                seconds = min(times[1:])
                engine.costs.steps.observe([r] * len(rows), [context] * len(rows), seconds)
                buckets = engine.costs.buckets  # where the static step serves: its bucket's price too
                if buckets is not None and (bucket := buckets.choose(b * r, b)) is not None:
                    buckets.observe(bucket, seconds)
    finally:
        for slot in slots:
            engine.runner.free(slot)


def sync_device(device: torch.device) -> None:
    """Wait until ``device`` has run everything queued on it (CUDA runs kernels asynchronously; the
    CPU has nothing to wait for): what a timer around a forward needs on both sides."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_kernels(engine: Engine, slot: int, context: int) -> None:
    """Launch every compiled kernel variant a step can use, so that no request pays a compile:
    each verification mode (rejection only with a draft model) for every walk block size the
    tree sizes ``0 .. max_draft_tokens`` of the engine's default spec map to, and the KV
    compaction for every path-width block. The per-step integers of the kernels are not
    specialised on (``kernels.variants``), so these are all the variants. Requests that ask for
    larger trees than the default spec compile their block sizes on first use."""
    import torch

    from lookupspec import kernels
    from lookupspec.sampling import SamplingParams

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


def warm_text(text_engine: Any) -> None:
    """What a text engine's first request would otherwise pay for (:class:`lookupspec.text.TextEngine`,
    after its engine's :func:`warm_up`): one short generation, the prompt byte bound (a parse of the
    tokenizer's JSON, once) and a chat prompt through the template and the tokenizer."""
    params = text_engine.params(max_tokens=4, temperature=0.0)
    for _ in text_engine.engine.generate([0, 1, 2, 3], params):
        pass
    _ = text_engine.prompt_bound  # a cached property: computed here, once
    text_engine.encode_prompt(messages=[{"role": "user", "content": "warm-up"}])
