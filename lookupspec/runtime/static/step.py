"""The static step, eagerly: plan a step's rows into a bucket, upload its inputs, run the forward.

:class:`StaticStep` is the host side of the static-shape step over a KV pool (a runner's):

- :meth:`StaticStep.plan` makes room in every slot (``pool.ensure``), picks the bucket
  (:class:`~.buckets.BucketConfig`) and lays the rows out on the host (:func:`~.layout.lay_out`). A
  step no bucket holds gets a bucket of its exact size, runs eagerly all the same, and carries the
  reason (``StepPlan.fallback``) for the graph runner's log line.
- :meth:`StaticStep.run` copies the plan into the bucket's one device buffer (the step's one
  host-to-device copy, from pinned memory on CUDA) and runs :class:`~.forward.StaticForward` on
  views of it; then each slot advances by its rows, as ``ModelRunner.run`` does. The caller
  truncates what verification rejects.

Each bucket keeps one device buffer for its whole life, so a CUDA graph captured on it
(:mod:`.graphs`) reads each step's inputs where eager runs read them. The step holds one slot of
the pool as its **scratch slot**: padding rows write their keys and values there, and no sequence
ever reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..kvpool import SlotPool
from ..ragged import SeqRows
from .buckets import Bucket, BucketConfig
from .forward import StaticForward, unsupported
from .layout import InputTable, StepTensors, lay_out

__all__ = ["StaticStep", "StepPlan"]


@dataclass(frozen=True)
class StepPlan:
    """One planned step: its bucket, its sequences, their rows, its host inputs."""

    bucket: Bucket
    seqs: tuple[SeqRows, ...]
    real_rows: int
    host: np.ndarray  # [InputTable.size] int64
    fallback: str | None = None  # why no configured bucket holds it (it runs eagerly, exact-sized)


class _Inputs:
    """A bucket's device buffer, and the pinned host buffer its uploads come from on CUDA."""

    def __init__(self, table: InputTable, device: torch.device) -> None:
        self.table = table
        cuda = device.type == "cuda"
        self.host = torch.zeros(table.size, dtype=torch.int64, pin_memory=cuda)
        self.device = torch.zeros(table.size, dtype=torch.int64, device=device) if cuda else self.host
        self.views: StepTensors = table.views(self.device)
        self._copied: Any = None  # the CUDA event of the last upload (its pinned source is in use until then)

    def upload(self, host: np.ndarray) -> None:
        if self.device is self.host:  # the CPU: the host buffer is the device buffer
            self.host.numpy()[:] = host
            return
        if self._copied is not None and not self._copied.query():
            # the previous step's copy still reads the pinned buffer (in practice it finished long
            # ago: the step read its results back since); query() itself never blocks
            self._copied.synchronize()
        self.host.numpy()[:] = host
        self.device.copy_(self.host, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()


class StaticStep:
    """The static-shape step of ``model`` over ``pool`` (module docstring). ``backend``: the
    attention kernel's (None: Triton on CUDA, the torch twin elsewhere)."""

    def __init__(self, model: Any, pool: SlotPool, *, buckets: BucketConfig | None = None,
                 backend: str | None = None) -> None:
        self.pool = pool
        self.buckets = buckets or BucketConfig()
        windows = [spec.window for spec in pool.layer_specs]
        self.forward = StaticForward(model, windows, backend=backend)
        self.device = pool.device
        self.scratch = pool.allocate(1)  # held for the step's life: padding rows write here
        self._inputs: dict[Bucket, _Inputs] = {}

    @staticmethod
    def unsupported(model: Any, pool: SlotPool) -> str | None:
        """Why a static step cannot serve ``model`` over ``pool`` (None: it can)."""
        return unsupported(model, [spec.window for spec in pool.layer_specs])

    def close(self) -> None:
        """Give the scratch slot back to the pool."""
        if self.pool.used[self.scratch]:
            self.pool.free(self.scratch)

    def table(self, bucket: Bucket) -> InputTable:
        return self.inputs(bucket).table

    def inputs(self, bucket: Bucket) -> _Inputs:
        """The bucket's buffers (made on first use; an exact-sized fallback bucket's are dropped after
        its step)."""
        got = self._inputs.get(bucket)
        if got is None:
            got = _Inputs(InputTable(bucket, len(self.pool.groups)), self.device)
            self._inputs[bucket] = got
        return got

    def plan(self, seqs: Sequence[SeqRows]) -> StepPlan:
        """Room in every slot, the bucket, the host inputs (module docstring)."""
        if not seqs:
            raise ValueError("a step needs at least one sequence")
        for s in seqs:
            self.pool.ensure(s.slot, int(self.pool.length[s.slot]) + len(s.tokens))
        rows = sum(len(s.tokens) for s in seqs)
        bucket = self.buckets.choose(rows, len(seqs))
        fallback = None
        if bucket is None:
            fallback = self.buckets.why_not(rows, len(seqs))
            bucket = Bucket(rows, len(seqs))
        host = lay_out(self.pool, seqs, bucket, self.scratch)
        return StepPlan(bucket, tuple(seqs), rows, host, fallback)

    def upload(self, plan: StepPlan) -> StepTensors:
        """The plan's one host-to-device copy into its bucket's buffer; its tensors there."""
        inputs = self.inputs(plan.bucket)
        inputs.upload(plan.host)
        return inputs.views

    def padding(self, bucket: Bucket) -> np.ndarray:
        """Host inputs of a step of padding rows alone (they write to the scratch slot only): what a
        graph is warmed up and captured on."""
        return lay_out(self.pool, [], bucket, self.scratch)

    def commit(self, plan: StepPlan) -> None:
        """Each slot advances by its rows (their keys and values are in the pool now)."""
        for s in plan.seqs:
            self.pool.advance(s.slot, len(s.tokens))
        if plan.fallback is not None:
            self._inputs.pop(plan.bucket, None)

    @torch.inference_mode()
    def run(self, plan: StepPlan) -> torch.Tensor:
        """Eagerly: logits ``[real rows, vocab]`` of the plan's rows, in the order of its sequences."""
        logits = self.forward(self.upload(plan), self.pool)
        self.commit(plan)
        return logits[: plan.real_rows]

    @torch.inference_mode()
    def forward_rows(self, seqs: Sequence[SeqRows]) -> torch.Tensor:
        """:meth:`plan` and :meth:`run`: ``ModelRunner.forward``'s contract on the static path."""
        return self.run(self.plan(seqs))
