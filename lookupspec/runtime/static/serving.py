"""The static step as the runner's forward (``--cuda-graphs``, ``EngineConfig.cuda_graphs``).

:class:`~lookupspec.runtime.ModelRunner` plans and runs each forward; where :class:`StaticPath` serves
it, the plan is a :class:`~.step.StepPlan` (the step's rows laid into a bucket) instead of a ragged
batch, and the run replays the bucket's CUDA graph (:mod:`.graphs`) or, off CUDA, runs the same
static forward eagerly (:mod:`.step`). The modes (:data:`lookupspec.config.CUDA_GRAPHS`):

- ``auto`` (the default): on for a model on a CUDA device, off elsewhere;
- ``on``: on wherever the static forward covers the model. On CUDA every bucket is a graph; on the
  CPU, which has no graphs, the static step runs eagerly: slower than the CPU's own path, and what
  the CPU tests run to prove the static step's tokens against that path;
- ``off``: the ragged path serves every forward, as before the static step existed.

Only a runner the static step serves is changed at all: its KV pool gets one slot beyond
``max_batch``, the **scratch slot** the step's padding rows write to (:mod:`.layout`), which it takes
at once and no sequence ever gets. A runner with the static step off has the pool, objects and
forwards it had before.

What the static step cannot serve takes the ragged path, with one log line per reason (logger
``lookupspec.runtime.static``), never one per step:

- a model the static forward does not cover (:func:`.forward.unsupported`: another architecture,
  q/k norms, a RoPE that reads positions back to the host): every forward of that runner
  (:func:`serves` says so once, when the runner is built);
- a step no bucket holds (more rows or more sequences than the largest bucket): that forward only.
  Both paths write the same pool at the same entries, so the next step may take either.

Example: ``serves("auto", model, windows, torch.device("cpu"))`` is False (the CPU keeps its path);
``serves("on", model, windows, torch.device("cpu"))`` is True for a Llama and, with a log line, False
for a Gemma 2.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from lookupspec.config import CUDA_GRAPHS

from ..kvpool import SlotPool
from ..ragged import SeqRows
from .buckets import Bucket, BucketConfig
from .forward import unsupported
from .graphs import GraphStep
from .step import StaticStep, StepPlan

__all__ = ["COMMON_ROWS", "StaticPath", "serves", "wanted"]

log = logging.getLogger("lookupspec.runtime.static")

# Warm-up captures every bucket of up to this many rows (decode steps of up to 64 sequences, a tree
# and its root, a few sequences' trees): 28 graphs at most; larger buckets capture on first use.
COMMON_ROWS = 64


def wanted(mode: str, device: torch.device) -> bool:
    """Whether ``mode`` asks for the static step on ``device`` (module docstring)."""
    if mode not in CUDA_GRAPHS:
        raise ValueError(f"cuda_graphs must be one of {', '.join(CUDA_GRAPHS)}, got {mode!r}")
    return mode == "on" or (mode == "auto" and device.type == "cuda")


def serves(mode: str, model: Any, windows: list[int | None], device: torch.device) -> bool:
    """Whether the static step serves ``model``'s forwards under ``mode`` (``windows``: each layer's
    sliding window as the KV pool lays it out). A model it was asked for and cannot serve gets one
    log line saying why (a warning where ``on`` asked for it explicitly)."""
    if not wanted(mode, device):
        return False
    reason = unsupported(model, windows)
    if reason is None:
        return True
    log.log(logging.WARNING if mode == "on" else logging.INFO,
            "the static step cannot serve this model, its forwards take the ragged path: %s", reason)
    return False


class StaticPath:
    """The static step of ``model`` over ``pool`` (which must have a free slot for the scratch slot),
    as the runner's ``plan`` / ``run``. ``graphs``: replay CUDA graphs (the pool must be on CUDA);
    else every step runs eagerly. ``buckets``: the shapes (None: :class:`~.buckets.BucketConfig`'s)."""

    def __init__(self, model: Any, pool: SlotPool, *, graphs: bool, buckets: BucketConfig | None = None,
                 backend: str | None = None) -> None:
        self.step = StaticStep(model, pool, buckets=buckets, backend=backend)
        self.graphs = GraphStep(self.step, "on") if graphs else None
        self.fallbacks: Counter[str] = Counter()  # forwards that took the ragged path, by reason

    @property
    def pool(self) -> SlotPool:
        return self.step.pool

    @property
    def scratch(self) -> int:
        return self.step.scratch

    def plan(self, seqs: Sequence[SeqRows]) -> StepPlan | None:
        """The host half of a forward: room in every slot, the rows laid into their bucket. None when
        no bucket holds the step (the caller takes the ragged path; logged once per reason) or it has
        no rows at all (the ragged path's business, as before)."""
        if not seqs:
            return None
        buckets = self.step.buckets
        rows = sum(len(s.tokens) for s in seqs)
        reason = None
        if rows > buckets.max_rows:
            reason = f"steps of more than {buckets.max_rows} rows"
        elif len(seqs) > buckets.max_seqs:
            reason = f"steps of more than {buckets.max_seqs} sequences"
        if reason is not None:
            if reason not in self.fallbacks:
                log.info("no static bucket holds %s: they take the ragged path", reason)
            self.fallbacks[reason] += 1
            return None
        return self.step.plan(seqs)

    @torch.inference_mode()
    def run(self, plan: StepPlan, keep: torch.Tensor | None = None) -> torch.Tensor:
        """The device half: logits ``[real rows, vocab]`` (or of the rows listed in ``keep``) of a
        planned step; each slot advances by its rows. A replayed graph's logits are copied out of
        its static output, which the bucket's next replay overwrites (a chunk's last row is read
        after later forwards)."""
        if self.graphs is None:
            logits = self.step.run(plan)
            return logits if keep is None else logits.index_select(0, keep)
        logits = self.graphs.run(plan)
        return logits.clone() if keep is None else logits.index_select(0, keep)

    def capture(self, max_seqs: int, max_rows: int = COMMON_ROWS) -> list[Bucket]:
        """Capture the graphs of the common buckets now (every bucket of at most ``max_rows`` rows
        whose sequences a batch of ``max_seqs`` needs), so that a server pays for them before it says
        ready; the buckets captured (none without graphs)."""
        if self.graphs is None:
            return []
        buckets = self.step.buckets
        seq_cap = next((s for s in buckets.seqs if s >= max_seqs), buckets.max_seqs)
        chosen = [b for b in buckets.all() if b.rows <= max_rows and b.seqs <= seq_cap]
        self.graphs.capture(chosen)
        return chosen
