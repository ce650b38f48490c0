"""One host-to-device copy for everything a step sends to the model's device.

A step's inputs are many small host arrays: the ragged batch's token ids, positions, KV write
indices and tree masks, the verification layout and sampling parameters, the compaction plan. Made
one tensor at a time they would cost one host-to-device copy each (a launch and, from pageable
memory, a synchronisation); :class:`HostStage` packs them into one host buffer (pinned on CUDA),
moves it with one copy and hands out device views of it.

Example::

    stage = HostStage(device)
    ids = stage.add([[5, 7, 9]], torch.int64)       # a Staged reference, no tensor yet
    mask = stage.add(np.ones((3, 4), bool), torch.bool)
    stage.upload()                                  # the one copy
    ids.tensor                                      # [1, 3] int64 on `device`, a view of the buffer

Every piece starts at a multiple of :data:`ALIGN` bytes, so that a view may be reinterpreted as any
dtype and Triton's pointer-alignment specialisation sees the same alignment every step. On the CPU
the host buffer is the device buffer: nothing is copied.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["ALIGN", "HostStage", "Staged"]

ALIGN = 16  # bytes

_NUMPY = {torch.int8: np.int8, torch.uint8: np.uint8, torch.int32: np.int32, torch.int64: np.int64,
          torch.float32: np.float32, torch.bool: np.bool_}


class Staged:
    """A piece of a :class:`HostStage`: its tensor on the stage's device once uploaded."""

    __slots__ = ("_stage", "dtype", "index", "shape")

    def __init__(self, stage: HostStage, index: int, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        self._stage, self.index, self.dtype, self.shape = stage, index, dtype, shape

    @property
    def tensor(self) -> torch.Tensor:
        return self._stage.view(self)


class HostStage:
    """Collects host arrays, then moves them to ``device`` in one copy (:meth:`upload`)."""

    uploads = 0  # copies made by every stage so far (the tests count them per step)

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._arrays: list[np.ndarray] = []
        self._views: list[torch.Tensor] | None = None
        self._host: torch.Tensor | None = None  # kept alive until the stage is dropped (async copy)

    def add(self, values: Any, dtype: torch.dtype) -> Staged:
        """Stage ``values`` (a nested list or a NumPy array; its shape is kept) as ``dtype``."""
        if self._views is not None:
            raise RuntimeError("this stage has been uploaded; start a new one")
        if dtype not in _NUMPY:
            raise ValueError(f"cannot stage {dtype}")
        arr: np.ndarray = np.ascontiguousarray(np.asarray(values, dtype=_NUMPY[dtype]))
        self._arrays.append(arr)
        return Staged(self, len(self._arrays) - 1, dtype, tuple(arr.shape))

    @property
    def uploaded(self) -> bool:
        return self._views is not None

    def upload(self) -> None:
        """Pack every staged array into one host buffer and move it to the device in one copy."""
        if self._views is not None:
            raise RuntimeError("this stage has already been uploaded")
        offsets, total = [], 0
        for arr in self._arrays:
            offsets.append(total)
            total += -(-arr.nbytes // ALIGN) * ALIGN
        cuda = self.device.type == "cuda"
        # explicit device: the staging buffer is the one tensor a step builds from host data
        host = torch.empty(max(total, ALIGN), dtype=torch.uint8, device="cpu", pin_memory=cuda)
        flat = host.numpy()
        for arr, off in zip(self._arrays, offsets, strict=True):
            flat[off:off + arr.nbytes] = arr.reshape(-1).view(np.uint8)
        if cuda:
            dev = host.to(self.device, non_blocking=True)  # from pinned memory: no host sync
            self._host = host
        else:
            dev = host  # the CPU is the model's device: no copy
        HostStage.uploads += 1
        self._views = [dev[off:off + arr.nbytes].view(_torch(arr.dtype)).view(arr.shape)
                       for arr, off in zip(self._arrays, offsets, strict=True)]

    def view(self, ref: Staged) -> torch.Tensor:
        if self._views is None:
            raise RuntimeError("the stage has not been uploaded yet")
        return self._views[ref.index]


def _torch(dtype: np.dtype) -> torch.dtype:
    for t, n in _NUMPY.items():
        if np.dtype(n) == dtype:
            return t
    raise ValueError(f"cannot stage {dtype}")

