"""CUDA graphs of the static step: each bucket's forward captured once, then replayed.

:class:`GraphStep` wraps a :class:`~.step.StaticStep`. The first step in a bucket captures the
bucket's forward with ``torch.cuda.CUDAGraph``, following torch's recipe: warm-up runs on a side
stream (they compile the Triton kernels, pick cuBLAS's algorithms and settle the caching
allocator), the current stream waits for them, then one run is captured into the graph. Warm-up and
capture run on an all-padding layout of the bucket, so they write to the scratch slot alone and
leave every sequence's cache as it was. Later steps copy their inputs into the bucket's input buffer
(the step's one host-to-device copy; the graph reads it from the same address) and replay.

Graphs share one memory pool (captured largest bucket first by :meth:`GraphStep.capture`, so
smaller ones reuse its memory): they never run at once. Each graph's logits are a static tensor that
the next replay of the same bucket overwrites; a caller reads them (verification) before that.

A captured graph holds the KV pool's addresses. When the pool reallocates (it grew: a pool with a
byte budget, reserved at start, never does) every graph is dropped and captured again, with a log
line.

The hand-captured graph rather than ``torch.compile(mode="reduce-overhead")``: the forward is
already a fixed sequence of kernels, capture takes milliseconds instead of a compile of minutes,
and the Triton attention kernel stays the same kernel the CPU tests run under the interpreter. The
GPU check (``scripts/gpu-check.sh``) measures both paths it has, eager and graph.

Whatever cannot be a graph runs eagerly, and says why once per reason (:attr:`GraphStep.fallbacks`
counts them): graphs off, no CUDA device, a step no bucket holds.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import torch

from lookupspec.config import CUDA_GRAPHS

from .buckets import Bucket
from .step import StaticStep, StepPlan

__all__ = ["GRAPH_MODES", "GraphStep", "graph_unsupported"]

log = logging.getLogger("lookupspec.runtime.static")

GRAPH_MODES = CUDA_GRAPHS  # the engine's option (``EngineConfig.cuda_graphs``)


def graph_unsupported(mode: str, device: torch.device) -> str | None:
    """Why steps on ``device`` run eagerly under ``mode`` (None: they are captured). ``on`` where no
    graph can run is an error, not a fallback."""
    if mode not in GRAPH_MODES:
        raise ValueError(f"cuda graphs must be one of {', '.join(GRAPH_MODES)}, got {mode!r}")
    if mode == "off":
        return "CUDA graphs are off"
    if device.type != "cuda":
        if mode == "on":
            raise ValueError(f"CUDA graphs are on, but the model runs on {device}")
        return f"CUDA graphs need a CUDA device (the model runs on {device})"
    return None


class _Graph:
    """One bucket's captured forward and its static logits."""

    def __init__(self, graph: Any, logits: torch.Tensor, generation: int) -> None:
        self.graph, self.logits, self.generation = graph, logits, generation


class GraphStep:
    """Replays each bucket's captured forward (module docstring). ``warmup``: eager runs before a
    capture."""

    def __init__(self, step: StaticStep, mode: str = "auto", *, warmup: int = 3) -> None:
        self.step = step
        self.mode = mode
        self.reason = graph_unsupported(mode, step.device)
        self.warmup = int(warmup)
        self._graphs: dict[Bucket, _Graph] = {}
        self._mempool: Any = None
        self.fallbacks: Counter[str] = Counter()  # eager steps by reason
        self.captures = 0  # graphs captured so far (recaptures included)

    @property
    def enabled(self) -> bool:
        return self.reason is None

    def why_eager(self, plan: StepPlan) -> str | None:
        """Why this plan runs eagerly (None: it replays a graph)."""
        return self.reason if self.reason is not None else plan.fallback

    def _eager(self, plan: StepPlan, reason: str) -> torch.Tensor:
        if reason not in self.fallbacks:
            log.info("static step runs eagerly: %s", reason)
        self.fallbacks[reason] += 1
        return self.step.run(plan)

    @torch.inference_mode()
    def run(self, plan: StepPlan) -> torch.Tensor:
        """Logits ``[real rows, vocab]`` of a planned step, from its bucket's graph (captured now if
        it is the bucket's first step) or eagerly (:meth:`why_eager`). The graph's logits are a view
        of a static tensor: read them before the bucket's next step."""
        reason = self.why_eager(plan)
        if reason is not None:
            return self._eager(plan, reason)
        graph = self._graph(plan.bucket)
        self.step.upload(plan)
        graph.graph.replay()
        self.step.commit(plan)
        return graph.logits[: plan.real_rows]

    def capture(self, buckets: list[Bucket] | None = None) -> None:
        """Capture ``buckets`` now (None: every configured bucket), largest first, so that a server
        pays for them at start rather than at a bucket's first step."""
        if self.reason is not None:
            return
        for bucket in sorted(buckets if buckets is not None else self.step.buckets.all(), reverse=True):
            self._graph(bucket)

    def _graph(self, bucket: Bucket) -> _Graph:
        generation = self.step.pool.generation
        got = self._graphs.get(bucket)
        if got is not None and got.generation == generation:
            return got
        if got is not None:
            log.info("the KV pool was reallocated: recapturing the static step's CUDA graphs")
            self._graphs.clear()
        got = self._capture(bucket)
        self._graphs[bucket] = got
        return got

    @torch.inference_mode()
    def _capture(self, bucket: Bucket) -> _Graph:
        step = self.step
        inputs = step.inputs(bucket)
        inputs.upload(step.padding(bucket))
        views = inputs.views
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                step.forward(views, step.pool)
        current.wait_stream(side)
        if self._mempool is None:
            self._mempool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._mempool):
            logits = step.forward(views, step.pool)
        self.captures += 1
        return _Graph(graph, logits, step.pool.generation)
