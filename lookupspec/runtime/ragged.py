"""A ragged batch: many sequences' rows in one forward, each attending only to its own cache.

A forward takes, per sequence, the rows it adds (:class:`SeqRows`): a prefill chunk, one token of
plain decoding, or a draft step (the root, then the draft nodes). All rows of all sequences are
flattened into one ``[1, rows]`` input, so every row-wise op of the model (embeddings, norms,
linear layers, the MLP, rotary embeddings by each row's own position) runs once for the whole batch.
Attention is the only op that mixes rows; :mod:`lookupspec.runtime.attention` runs it per sequence,
over that sequence's slot in the :class:`~lookupspec.runtime.kvpool.SlotPool`, with the masks built
here. There is no block-diagonal mask over the whole batch.

Row structure of one sequence with ``n`` rows and ``past`` committed positions: ``parents`` is
``None`` for a causal chain (row ``i`` sees rows ``0..i``; position ``past + i``) or a tree over the
rows (``parents[i] < i``, -1 = hangs off the cache; row ``i`` sees itself and its ancestors; its
position is ``past + depth``, depth 0 for parent -1). A sliding-window layer (window ``W``) also hides
every key at a position ``<= q - W`` from a row at position ``q``, exactly as transformers' masks do.

Example: a sequence with ``past = 100`` and a draft step ``tokens = [r, a, b, c]``, ``parents = [-1,
0, 0, 1]`` (root r; a and b children of r; c child of a): positions ``[100, 101, 101, 102]``; row c
sees the cache, r, a and itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lookupspec.kernels import HostStage, Staged

from .kvpool import SlotPool

__all__ = ["CAUSAL", "RaggedBatch", "SeqRows", "SeqView"]

CAUSAL = "causal"  # mask marker: rows 0..n-1 over exactly n keys, causal (SDPA's is_causal)


@dataclass(frozen=True)
class SeqRows:
    """The rows one sequence adds in a forward."""

    slot: int
    tokens: Sequence[int]  # [n] token ids of the rows
    parents: Sequence[int] | None = None  # [n] tree over the rows (-1 = off the cache); None = chain

    def __post_init__(self) -> None:
        if len(self.tokens) == 0:
            raise ValueError("a sequence adds at least one row")
        if self.parents is not None:
            if len(self.parents) != len(self.tokens):
                raise ValueError("parents must have one entry per row")
            for i, p in enumerate(self.parents):
                if not -1 <= int(p) < i:
                    raise ValueError(f"parents[{i}] = {p}: a parent must be -1 or an earlier row")


@dataclass
class SeqView:
    """One sequence's place in a built batch: its rows ``[r0, r1)`` and, per pool group, the entry
    range of its keys and the mask over them (None: every key visible; CAUSAL; or bool
    ``[1, 1, n, keys]``)."""

    slot: int
    r0: int
    r1: int
    past: int
    key_range: list[tuple[int, int]] = field(default_factory=list)
    masks: list[Any] = field(default_factory=list)  # torch.Tensor | str | None (a Staged until bound)
    _additive: dict[tuple[int, torch.dtype], torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def rows(self) -> int:
        return self.r1 - self.r0

    def sdpa_mask(self, group: int, dtype: torch.dtype) -> torch.Tensor | str | None:
        """The group's mask as SDPA takes it from a query of ``dtype``: a boolean mask becomes the
        additive one (0 where visible, -inf elsewhere) once per forward. SDPA makes exactly that
        tensor from a boolean mask on every call, so the output is bit for bit the same, without a
        conversion in every layer. Off the CPU the mask stays boolean: there SDPA may pick its kernel
        by the mask's type."""
        mask = self.masks[group]
        if not isinstance(mask, torch.Tensor) or mask.device.type != "cpu":
            return mask
        key = (group, dtype)
        if key not in self._additive:
            self._additive[key] = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
                ~mask, float("-inf"))
        return self._additive[key]


def _reach(parents: np.ndarray) -> np.ndarray:
    """reach[i, j]: row j is row i or one of its ancestors. parents: [n] -> [n, n] bool."""
    n = len(parents)
    reach = np.eye(n, dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            reach[i] |= reach[p]
    return reach


class RaggedBatch:
    """The flattened inputs of one forward and the per-sequence attention plan.

    ``input_ids`` / ``position_ids``: ``[1, rows]`` (plus ``pad`` rows at the end that belong to no
    sequence: the runtime pads a one-row forward to two rows where the probe found that a matrix
    product of one row differs from the same row among others). ``write_slot`` / ``write_entry[g]``:
    ``[real_rows]`` where each row's key and value go in the pool (group ``g``).
    ``unplanned_masks``: masked views may run on the attention backends that plan nothing per shape
    (:func:`~lookupspec.runtime.attention.unplanned_sdpa`), as unmasked ones always do."""

    def __init__(self, pool: SlotPool, seqs: Sequence[SeqRows], *, pad_to: int = 1,
                 stage: HostStage | None = None, unplanned_masks: bool = False) -> None:
        """Plan the batch on the host. Its tensors are pieces of ``stage`` (the step's one
        host-to-device copy): usable once the caller uploaded it and called :meth:`bind`. Without a
        stage the batch makes and uploads its own."""
        if not seqs:
            raise ValueError("a batch needs at least one sequence")
        slots = [s.slot for s in seqs]
        if len(set(slots)) != len(slots):
            raise ValueError("a sequence may appear only once in a batch")
        self.pool = pool
        self.unplanned_masks = unplanned_masks
        own = stage is None
        stage = HostStage(pool.device) if stage is None else stage
        ids: list[int] = []
        pos: list[int] = []
        wslot: list[int] = []
        wpos: list[int] = []  # row i of a sequence is stored at position past + i (not its depth)
        self.views: list[SeqView] = []
        row = 0
        for s in seqs:
            pool._check(s.slot)
            n = len(s.tokens)
            past = int(pool.length[s.slot])
            if s.parents is None:
                depth = np.arange(n, dtype=np.int64)
                reach = None
            else:
                par = np.asarray(s.parents, dtype=np.int64)
                reach = _reach(par)
                depth = reach.sum(axis=1).astype(np.int64) - 1
            positions = past + depth
            view = SeqView(s.slot, row, row + n, past)
            for g in pool.groups:
                start = int(g.start[s.slot])
                keys = self._keys(g.window, start, past, n, int(positions.min()))
                view.key_range.append(keys)
                mask = self._mask(g.window, start, past, positions, reach, keys)
                view.masks.append(stage.add(mask[None, None], torch.bool) if isinstance(mask, np.ndarray)
                                  else mask)
            self.views.append(view)
            ids.extend(int(t) for t in s.tokens)
            pos.extend(int(p) for p in positions)
            wslot.extend([s.slot] * n)
            wpos.extend(range(past, past + n))
            row += n
        self.real_rows = row
        self.pad = max(0, pad_to - row)
        self.native_plans: dict[int, Any] = {}  # per pool group, native.attention's plan (made on first use)
        wpos_a = np.asarray(wpos, dtype=np.int64)
        self._staged = (stage.add(np.asarray([ids + [0] * self.pad], np.int64), torch.int64),
                        stage.add(np.asarray([pos + [0] * self.pad], np.int64), torch.int64),
                        stage.add(np.asarray(wslot, np.int64), torch.int64),
                        [stage.add(wpos_a - g.start[wslot], torch.int64) for g in pool.groups])
        self.input_ids: torch.Tensor  # these four are set by bind()
        self.position_ids: torch.Tensor
        self.write_slot: torch.Tensor
        self.write_entry: list[torch.Tensor]
        if own:
            stage.upload()
            self.bind()

    def bind(self) -> None:
        """Take the batch's tensors from its uploaded stage."""
        ids, pos, wslot, wentry = self._staged
        self.input_ids = ids.tensor  # [1, rows] int64
        self.position_ids = pos.tensor  # [1, rows] int64
        self.write_slot = wslot.tensor  # [real_rows] int64
        self.write_entry = [w.tensor for w in wentry]  # per group [real_rows] int64
        for view in self.views:
            view.masks = [m.tensor if isinstance(m, Staged) else m for m in view.masks]

    @property
    def rows(self) -> int:
        return self.real_rows + self.pad

    @staticmethod
    def _keys(window: int | None, start: int, past: int, n: int, q_min: int) -> tuple[int, int]:
        """Entry range of the keys a sequence's rows may see: its cache (from the oldest position
        any row can see in a sliding group) and its own rows."""
        first = start if window is None else max(start, q_min - window + 1)
        return first - start, past - start + n

    @staticmethod
    def _mask(window: int | None, start: int, past: int, positions: np.ndarray, reach: np.ndarray | None,
              key_range: tuple[int, int]) -> np.ndarray | str | None:
        n = len(positions)
        lo, hi = key_range
        cached = past - start - lo  # cache keys in range, at positions past - cached .. past - 1
        windowed = window is not None and int(positions.max()) - (past - cached) >= window
        if reach is None and not windowed:
            if n == 1:
                return None
            if cached == 0:
                return CAUSAL
        if n == 1 and not windowed:
            return None
        vis = np.ones((n, hi - lo), dtype=bool)
        own = reach if reach is not None else np.tril(np.ones((n, n), dtype=bool))
        vis[:, cached:] = own
        if window is not None:
            key_pos = np.concatenate([np.arange(past - cached, past, dtype=np.int64), positions])
            vis &= (positions[:, None] - key_pos[None, :]) < window
        return vis  # [n, keys] bool, staged as [1, 1, n, keys]
