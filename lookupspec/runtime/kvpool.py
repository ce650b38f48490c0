"""The KV slot pool: the keys and values of many sequences, one slot per sequence.

Layers are grouped by what their cache must keep. A full-attention layer keeps every committed
position; a sliding-window layer (window ``W``: a query at position ``q`` sees keys at positions
``k > q - W``) keeps only the last ``W - 1`` committed positions, which is all any later query can
see, plus the rows of the forward in flight. Each group stores the keys and values of all its layers
in one tensor::

    data: [2 * layers, slots, kv_heads, capacity, head_dim]   # keys of layer i at [i], values at [layers + i]

so one layer's keys are ``[slots, kv_heads, capacity, head_dim]`` (a model whose value heads differ
in width gets two tensors per group, :class:`LayerGroup` hides which). Groups stay separate allocations
because they grow separately (a sliding group never outgrows its window); one compaction launch still
covers every tensor of every group, through a table of row addresses (``kernels.compact_plan``).

Per slot the pool tracks ``length`` (positions ``0 .. length - 1`` are committed) and, per group,
``start``: the position held by entry 0 (always 0 for full attention; it moves forward in a
sliding group when old entries are dropped). Position ``p`` of a slot lives at entry ``p - start``.

Example (one full layer, capacity 4): ``allocate()`` -> slot 0; a forward writes 3 rows at entries
0-2 and ``advance(0, 3)`` commits them (length 3); a draft step writes root + 2 nodes at entries 3-5
(``ensure`` grew the capacity to 8 first), verification accepts node 1 only, ``compact`` moves entry
5 to entry 4, ``truncate(0, 5)`` drops the rest.

A byte budget (``max_bytes``) is split evenly between the ``max_batch`` slots, so that every slot
can be in use at once: each may hold ``slot_positions`` positions. A sliding group's share is smaller
where the pool knows ``max_rows``, the most rows one forward appends to a slot (a prefill chunk, or a
step's root and draft nodes): such a group never holds more than ``W - 1`` committed positions plus
one forward's rows, so its slots get ``W - 1 + max_rows`` entries (rounded up) and the full-attention
groups the rest of the budget. Example, Gemma 3 1B's shape (26 layers of one 256-wide key and value
head in bfloat16, 22 of them sliding with W = 512), a 32k context and 16 slots in 1 GiB: a slot
holds 2,496 positions when every layer counts at full length, 12,160 when the sliding layers take
512 - 1 + 257 = 768 entries (``max_rows`` 257: a request's largest draft tree and its root).

A request whose slot cannot grow (past its share, or past the context window) gets
:class:`PoolFull` from :meth:`ensure`; the engine then ends that request with
``finish_reason="length"`` and the rest of the batch goes on.

Growing reallocates and copies every tensor while the forwards wait: with many slots of long
sequences that is seconds (the first touch of gigabytes of fresh memory). :meth:`reserve` allocates
a budgeted pool whole, at once, so that a server pays it at start and never mid-load; ``resizes``
and ``resize_s`` count what growth has cost.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from .kvgroup import ALIGN, LayerGroup, LayerSpec, round_up

if TYPE_CHECKING:
    from lookupspec.kernels import HostStage, Staged

__all__ = ["CompactPlan", "LayerSpec", "PoolFull", "SlotPool"]


class PoolFull(RuntimeError):
    """A slot could not get the entries it asked for (byte budget or context window)."""


@dataclass(frozen=True)
class CompactPlan:
    """A step's compaction, staged before its forward (:meth:`SlotPool.plan_compact`)."""

    generation: int  # the pool's generation when planned: the row table's addresses hold until it changes
    tensors: list[torch.Tensor]  # every pool tensor, in table order
    tensor_groups: list[int]  # group of each tensor
    table: Staged  # [R, COLS] int64 row table (kernels.compact_plan)
    slots: Staged  # [B] int64
    base: Staged  # [B, groups] int64 entry of draft node 0 per sequence and group


class SlotPool:
    """Preallocated KV storage for up to ``max_batch`` sequences of up to ``max_positions`` positions.
    ``max_rows``: the most rows one forward appends to a slot (None: any number, up to the context
    window); sliding-window groups are sized for it (module docstring).

    Capacity (entries per slot) and the slot count grow on demand, by doubling, until
    ``max_bytes`` (None: no budget) would be exceeded. A single-threaded owner (the engine) calls it;
    nothing here is thread-safe."""

    def __init__(self, layers: Sequence[LayerSpec], *, dtype: torch.dtype, device: torch.device | str = "cpu",
                 max_batch: int = 64, max_positions: int = 2048, max_bytes: int | None = None,
                 max_rows: int | None = None, initial_slots: int = 1, initial_capacity: int = 256,
                 align: int = ALIGN) -> None:
        if not layers:
            raise ValueError("a slot pool needs at least one layer")
        if max_batch < 1 or max_positions < 2:
            raise ValueError(f"max_batch must be >= 1 and max_positions >= 2, got {max_batch}, "
                             f"{max_positions}")
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.layer_specs = tuple(layers)
        self.dtype = dtype
        self.device = torch.device(device)
        self.max_batch = int(max_batch)
        self.max_positions = int(max_positions)
        self.max_bytes = max_bytes
        self.align = int(align)  # capacities are multiples of this many entries
        self.max_rows = self.max_positions if max_rows is None else min(int(max_rows), self.max_positions)
        slots = min(max(1, initial_slots), self.max_batch)
        by_spec: dict[LayerSpec, list[int]] = {}
        for i, spec in enumerate(self.layer_specs):
            by_spec.setdefault(spec, []).append(i)
        # A budget is split evenly between the slots: each may hold ``slot_positions`` positions, so
        # that every slot can be in use at once whatever the others hold.
        self.slot_positions = self.max_positions
        if max_bytes is not None:
            # bytes of one position of a slot in each group, and the most entries its slots need
            groups = [(LayerGroup(spec, idx, 0, 0, dtype, self.device).bytes_for(1, 1),
                       self.window_entries(spec.window)) for spec, idx in by_spec.items()]
            share = self._budget_share(groups, max_bytes)
            if share < self.align:
                per_position = sum(b for b, _ in groups)
                raise PoolFull(f"a KV budget of {max_bytes} bytes cannot give {self.max_batch} slots "
                               f"{self.align} positions each ({per_position} bytes per position)")
            self.slot_positions = share
            initial_capacity = min(initial_capacity, self.slot_positions)
        self.generation = 0  # bumped whenever a tensor is reallocated (compaction tables hold addresses)
        with torch.inference_mode():  # the engine writes them in inference mode only
            self.groups = [LayerGroup(spec, idx, slots, self._initial_cap(spec, initial_capacity), dtype,
                                  self.device) for spec, idx in by_spec.items()]
        self._group_of = {layer: g for g in self.groups for layer in g.layers}
        self._group_index = {layer: i for i, g in enumerate(self.groups) for layer in g.layers}
        self.length = np.zeros(slots, dtype=np.int64)
        self.used = np.zeros(slots, dtype=bool)
        self.resizes = 0  # reallocations since construction (each copies every tensor)
        self.resize_s = 0.0  # seconds they took
        if self.max_bytes is not None and self.nbytes > self.max_bytes:
            raise PoolFull(f"the KV pool needs {self.nbytes} bytes for one slot; "
                           f"the budget is {self.max_bytes}")

    def _initial_cap(self, spec: LayerSpec, initial: int) -> int:
        cap = round_up(min(initial, self.max_positions), self.align)
        return cap if spec.window is None else min(cap, round_up(spec.window, self.align))

    def window_entries(self, window: int | None) -> int:
        """The most entries a slot of a group with this window ever needs (None: full attention, the
        context window): a sliding group's ``W - 1`` committed positions plus one forward's rows."""
        if window is None:
            return self.max_positions
        return min(round_up(self.max_positions, self.align),
                   round_up(window - 1 + self.max_rows, self.align))

    def _budget_share(self, groups: Sequence[tuple[int, int]], max_bytes: int) -> int:
        """The most positions (a multiple of ``align``, at most the context window) every one of the
        ``max_batch`` slots may hold within ``max_bytes``; ``groups``: (bytes a position, most entries
        a slot needs) of each group, so sliding groups count at their window's entries; 0 when not
        even ``align`` fit."""

        def fits(positions: int) -> bool:
            return self.max_batch * sum(b * min(positions, limit) for b, limit in groups) <= max_bytes

        lo, hi = 0, round_up(self.max_positions, self.align) // self.align  # in units of align
        while lo < hi:  # the largest multiple that fits (the cost grows with it)
            mid = (lo + hi + 1) // 2
            if fits(mid * self.align):
                lo = mid
            else:
                hi = mid - 1
        return min(self.max_positions, lo * self.align)

    def reserved_entries(self, g: LayerGroup) -> int:
        """The entries a slot of group ``g`` holds once the pool is reserved (:meth:`reserve`)."""
        return min(self.slot_positions, self.window_entries(g.window))

    # ---- bookkeeping ------------------------------------------------------------------------------

    @property
    def slots(self) -> int:
        """Slots allocated in memory (used or free)."""
        return len(self.length)

    @property
    def nbytes(self) -> int:
        return sum(g.bytes_for(self.slots, g.capacity) for g in self.groups)

    def group(self, layer: int) -> LayerGroup:
        return self._group_of[layer]

    def group_index(self, layer: int) -> int:
        return self._group_index[layer]

    def keys(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s keys: ``[slots, kv_heads, capacity, head_dim]``."""
        return self._group_of[layer].keys(layer)

    def values(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s values: ``[slots, kv_heads, capacity, value_dim]``."""
        return self._group_of[layer].values(layer)

    def start(self, slot: int, layer: int) -> int:
        """The position held by entry 0 of ``slot`` in ``layer``'s group."""
        return int(self._group_of[layer].start[slot])

    def in_use(self) -> int:
        return int(self.used.sum())

    # ---- slots ------------------------------------------------------------------------------------

    def allocate(self, positions: int = 1) -> int:
        """A free slot with room for ``positions`` positions (length 0). Raises :class:`PoolFull`."""
        free = np.flatnonzero(~self.used)
        if free.size:
            slot = int(free[0])
        elif self.slots < self.max_batch:
            slot = self.slots
            self._resize(min(self.max_batch, max(slot + 1, 2 * self.slots)), None)
        else:
            raise PoolFull(f"all {self.max_batch} slots are in use")
        self.used[slot] = True
        self.length[slot] = 0
        for g in self.groups:
            g.start[slot] = 0
        try:
            self._room(slot, positions, ahead=True)
        except PoolFull:
            self.used[slot] = False
            raise
        return slot

    def free(self, slot: int) -> None:
        self._check(slot)
        self.used[slot] = False
        self.length[slot] = 0

    def _check(self, slot: int) -> None:
        if not (0 <= slot < self.slots and self.used[slot]):
            raise ValueError(f"slot {slot} is not allocated")

    def ensure(self, slot: int, positions: int) -> None:
        """Make room in ``slot`` for positions up to ``positions`` (exclusive), the rows of a forward
        about to be written: full groups grow, sliding groups first drop entries no later query can
        see (all but the last ``W - 1`` committed positions). Raises :class:`PoolFull` past the
        context window or the byte budget, ValueError for a forward of more than ``max_rows`` rows
        where a sliding group was sized for ``max_rows``."""
        self._room(slot, positions, ahead=False)

    @torch.inference_mode()
    def _room(self, slot: int, positions: int, *, ahead: bool) -> None:
        """:meth:`ensure`; ``ahead``: room set aside for a sequence that will grow to ``positions`` in
        forwards of at most ``max_rows`` rows, of which a sliding group never holds more than its
        :meth:`window_entries`."""
        self._check(slot)
        if positions > self.max_positions:
            raise PoolFull(f"{positions} positions exceed the context window of {self.max_positions}")
        if positions > self.slot_positions:
            raise PoolFull(f"{positions} positions exceed a slot's share of the KV budget "
                           f"({self.slot_positions} positions for each of {self.max_batch} slots)")
        grow: dict[int, int] = {}
        for gi, g in enumerate(self.groups):
            start = int(g.start[slot])
            if positions - start <= g.capacity:
                continue
            if g.window is not None:
                keep_from = max(start, int(self.length[slot]) - (g.window - 1))
                if keep_from > start:
                    g.move(slot, keep_from - start, 0, int(self.length[slot]) - keep_from)
                    g.start[slot] = start = keep_from
            need = positions - start
            limit = self.window_entries(g.window)
            if need > limit:  # only a sliding group: a full one's need is within max_positions
                if not ahead:
                    rows = positions - int(self.length[slot])
                    raise ValueError(f"a forward of {rows} rows for slot {slot} "
                                     f"exceeds the {self.max_rows} rows this pool was sized for (max_rows)")
                need = limit
            if need > g.capacity:
                grow[gi] = need
        if grow:
            self._resize(None, grow)

    @torch.inference_mode()
    def _resize(self, slots: int | None, needed: dict[int, int] | None) -> None:
        slots = self.slots if slots is None else slots
        caps = [g.capacity for g in self.groups]
        for gi, need in (needed or {}).items():  # doubling, up to what a slot of the group can need
            limit = self.window_entries(self.groups[gi].window)
            caps[gi] = round_up(min(max(need, 2 * caps[gi]), max(need, limit)), self.align)
        total = sum(g.bytes_for(slots, c) for g, c in zip(self.groups, caps, strict=True))
        if self.max_bytes is not None and total > self.max_bytes:
            # retry with exactly what is needed before giving up
            for gi, need in (needed or {}).items():
                caps[gi] = max(self.groups[gi].capacity, round_up(need, self.align))
            total = sum(g.bytes_for(slots, c) for g, c in zip(self.groups, caps, strict=True))
            if total > self.max_bytes:
                raise PoolFull(f"the KV pool would need {total / 2**20:.1f} MiB "
                               f"(budget {self.max_bytes / 2**20:.1f} MiB)")
        self._reallocate(slots, caps)

    @torch.inference_mode()
    def reserve(self) -> None:
        """Allocate all ``max_batch`` slots at their full share of the budget now, so that the pool
        never grows (nor stalls a step to do so) later. Needs a byte budget: without one a slot's
        share is the whole context window. A sliding group takes its :meth:`window_entries`."""
        if self.max_bytes is None:
            raise ValueError("only a pool with a byte budget (max_bytes) can be reserved whole")
        self._reallocate(self.max_batch, [max(g.capacity, self.reserved_entries(g)) for g in self.groups])

    def _reallocate(self, slots: int, caps: Sequence[int]) -> None:
        t0 = time.perf_counter()
        changed = False
        for g, cap in zip(self.groups, caps, strict=True):
            if slots != g.tensors[0].shape[1] or cap != g.capacity:
                g.resize(slots, cap)
                self.generation += 1
                changed = True
        if slots > self.slots:
            extra = slots - self.slots
            self.length = np.concatenate([self.length, np.zeros(extra, np.int64)])
            self.used = np.concatenate([self.used, np.zeros(extra, bool)])
        if changed:
            self.resizes += 1
            self.resize_s += time.perf_counter() - t0

    # ---- contents ---------------------------------------------------------------------------------

    def entry(self, slot: int, layer: int, position: int) -> int:
        """The entry index that holds (or will hold) ``position`` of ``slot`` in ``layer``."""
        return position - int(self._group_of[layer].start[slot])

    def advance(self, slot: int, count: int) -> None:
        """Commit ``count`` more positions (written by a forward at entries from ``length`` on)."""
        self._check(slot)
        self.length[slot] += count

    def truncate(self, slot: int, length: int) -> None:
        """Drop positions from ``length`` on (rejected drafts), O(1). A sliding group must still hold
        the last ``W - 1`` positions before ``length`` (ValueError otherwise: they were dropped when
        the sequence grew past them; the engine never truncates below a step's start)."""
        self._check(slot)
        if not 0 <= length <= self.length[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.length[slot]} to {length}")
        for g in self.groups:
            if g.window is not None and g.start[slot] > max(0, length - (g.window - 1)):
                raise ValueError(f"slot {slot} no longer holds positions {length - (g.window - 1)}.. of its "
                                 "sliding-window layers")
        self.length[slot] = length

    def plan_compact(self, slots: Sequence[int], base: Sequence[int], stage: HostStage) -> CompactPlan:
        """Stage what :meth:`compact_planned` needs for the step's sequences (their slots, the entry
        of draft node 0 of each in each group, the row table of every pool tensor) with the step's
        other inputs. slots: [B]; base: [B] position of draft node 0 of each sequence. Valid until the
        pool grows (its :attr:`generation` changes)."""
        from lookupspec import kernels

        tensors = [t for g in self.groups for t in g.tensors]
        tensor_groups = [gi for gi, g in enumerate(self.groups) for _ in g.tensors]
        entries = [[int(p) - int(g.start[s]) for g in self.groups] for p, s in zip(base, slots, strict=True)]
        return CompactPlan(
            self.generation, tensors, tensor_groups,
            stage.add(kernels.pool_table(tensors, tensor_groups), torch.int64),
            stage.add(np.asarray(list(slots), np.int64), torch.int64),
            stage.add(np.asarray(entries, np.int64).reshape(len(entries), len(self.groups)), torch.int64))

    @torch.inference_mode()
    def compact_planned(self, plan: CompactPlan, accepted: torch.Tensor, num_accepted: torch.Tensor, *,
                        backend: str | None = None) -> None:
        """After a tree step: in every layer, move the accepted path's entries next to the root, one
        ``kernels.compact_pool`` launch for every layer's keys and values (the caller truncates).

        accepted: [B, M] accepted node indices (local, -1 padded) of the planned sequences, in plan
        order; num_accepted: [B]. A sequence whose path does not move (a chain) costs nothing."""
        from lookupspec import kernels

        if plan.generation != self.generation:
            raise RuntimeError("the pool grew after the compaction was planned: its row table is stale")
        kernels.compact_pool(plan.tensors, plan.tensor_groups, plan.table.tensor, plan.slots.tensor,
                             plan.base.tensor, accepted, num_accepted, backend=backend)

    @torch.inference_mode()
    def compact(self, slots: Sequence[int], accepted: torch.Tensor, num_accepted: torch.Tensor,
                base: Sequence[int], *, backend: str | None = None) -> None:
        """:meth:`plan_compact` and :meth:`compact_planned` with a stage of their own.

        slots: [B] slots of the step's sequences; accepted: [B, M] accepted node indices (local,
        -1 padded); num_accepted: [B]; base: [B] position of draft node 0 of each sequence."""
        from lookupspec import kernels

        if not len(slots) or accepted.shape[1] == 0:
            return
        stage = kernels.HostStage(self.device)
        plan = self.plan_compact(slots, base, stage)
        stage.upload()
        self.compact_planned(plan, accepted, num_accepted, backend=backend)

    @torch.inference_mode()
    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Make ``dst`` hold the first ``length`` positions of ``src`` (a shared prompt prefix).

        A sliding group copies only the last ``W - 1`` of them, which is what later queries see;
        raises ValueError when ``src`` has already dropped some of those."""
        self._check(src)
        self._check(dst)
        if src == dst:
            raise ValueError("copy_prefix needs two different slots")
        if not 0 <= length <= self.length[src]:
            raise ValueError(f"slot {src} holds {self.length[src]} positions, not {length}")
        first = [0 if g.window is None else max(0, length - (g.window - 1)) for g in self.groups]
        for g, lo in zip(self.groups, first, strict=True):
            if g.start[src] > lo:
                raise ValueError(f"slot {src} no longer holds positions {lo}.. of its sliding-window layers")
        self.length[dst] = 0
        for g, lo in zip(self.groups, first, strict=True):
            g.start[dst] = lo
        self.ensure(dst, length)
        for g, lo in zip(self.groups, first, strict=True):
            g.move(src, lo - int(g.start[src]), 0, length - lo, to_slot=dst)
        self.length[dst] = length
