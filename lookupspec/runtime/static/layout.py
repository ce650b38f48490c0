"""A step's rows laid into a bucket: fixed-shape index tensors that one host-to-device copy fills.

The ragged batch (:mod:`lookupspec.runtime.ragged`) plans each sequence's attention with its own
shapes (key ranges, masks of ``[n, keys]``), which a CUDA graph cannot replay. Here every input of a
step is a row-indexed table of a fixed size set by the :class:`~.buckets.Bucket` alone, all int64 in
one flat buffer (:class:`InputTable`), so that a step's one upload is a copy into the same device
buffer every time and a captured graph reads its inputs from fixed addresses.

Per row ``r`` (``R = bucket.rows``; the rows of sequence ``s`` are contiguous, first row ``f``):

- ``input_ids``, ``positions``: the token and its position (``past + depth``, as the ragged batch);
- ``row_slot``: the slot whose cache the row reads; ``cache_len[g]``: how many entries of that slot
  are committed in pool group ``g`` (``past - start``); ``cache_start[g]``: the position entry 0
  holds (a sliding group's ``start``), so entry ``e`` is position ``cache_start + e``;
- ``row_first`` (``f``) and ``row_bits`` ``[R, W]``: bit ``j - f`` of the row's words is set when
  row ``j`` of the step is the row itself or one of its ancestors (a causal chunk: every earlier row
  of it). Attention reads the step's own keys from the forward's tensors, not from the pool;
- ``write_slot``, ``write_entry[g]``: where the row's key and value go in the pool (row ``i`` of a
  sequence at position ``past + i``, as the ragged batch stores it);
- ``row_seq``: the row's sequence (-1 for padding); per sequence ``seq_first``, ``seq_rows``,
  ``seq_slot`` (the tables verification and compaction will read inside the graph).

Padding rows (``r >= real rows``) are their own one-row sequence with no cache: ``row_slot`` and
``write_slot`` are the **scratch slot** (a pool slot the static step holds and no sequence ever
reads), ``write_entry = r % capacity``, position 0, only their own bit set. Their logits are garbage
nobody reads; their keys and values land where nobody looks; they attend to one key, so their
softmax is finite. Padding sequences have ``seq_rows = 0`` and the scratch slot.

Example: bucket ``(rows=8, seqs=2)``, sequence A (slot 3, 10 cached positions) with the draft step
``[root, a, b]`` (parents ``[-1, 0, 0]``) and sequence B (slot 5, 4 cached) with one decode row:
rows 0-2 are A's (positions ``[10, 11, 11]``, ``row_first`` 0, bits ``0b001, 0b011, 0b101``,
``write_entry`` ``[10, 11, 12]``), row 3 is B's (position 4, bits ``0b1``), rows 4-7 are padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..kvpool import SlotPool
from ..ragged import SeqRows
from .buckets import Bucket

__all__ = ["InputTable", "StepTensors", "lay_out", "tree_bits"]

_ROW_FIELDS = ("input_ids", "positions", "row_slot", "row_first", "write_slot", "row_seq")
_GROUP_FIELDS = ("cache_len", "cache_start", "write_entry")
_SEQ_FIELDS = ("seq_first", "seq_rows", "seq_slot")


@dataclass
class StepTensors:
    """Views of one bucket's input buffer (every tensor int64, on the buffer's device)."""

    input_ids: torch.Tensor  # [R]
    positions: torch.Tensor  # [R]
    row_slot: torch.Tensor  # [R]
    row_first: torch.Tensor  # [R]
    write_slot: torch.Tensor  # [R]
    row_seq: torch.Tensor  # [R]
    row_bits: torch.Tensor  # [R, W]
    cache_len: torch.Tensor  # [G, R]
    cache_start: torch.Tensor  # [G, R]
    write_entry: torch.Tensor  # [G, R]
    seq_first: torch.Tensor  # [S]
    seq_rows: torch.Tensor  # [S]
    seq_slot: torch.Tensor  # [S]


class InputTable:
    """Where each field of a bucket's inputs sits in its flat int64 buffer (``groups``: the KV
    pool's groups). The order is fixed, so the same bucket always has the same table. Every field
    starts at a multiple of 16 bytes (as :class:`~lookupspec.kernels.HostStage` aligns its pieces), so
    Triton's pointer-alignment specialisation is the same for every bucket."""

    def __init__(self, bucket: Bucket, groups: int) -> None:
        if groups < 1:
            raise ValueError(f"a KV pool has at least one group, got {groups}")
        r, s = bucket.rows, bucket.seqs
        shapes: dict[str, tuple[int, ...]] = {name: (r,) for name in _ROW_FIELDS}
        shapes["row_bits"] = (r, bucket.words)
        shapes |= {name: (groups, r) for name in _GROUP_FIELDS}
        shapes |= {name: (s,) for name in _SEQ_FIELDS}
        self.bucket, self.groups = bucket, groups
        self.fields: dict[str, tuple[int, tuple[int, ...]]] = {}
        offset = 0
        for name, shape in shapes.items():
            self.fields[name] = (offset, shape)
            offset += -(-int(np.prod(shape)) // 2) * 2  # two int64 elements: 16 bytes
        self.size = offset  # int64 elements

    def host(self, buffer: np.ndarray, name: str) -> np.ndarray:
        """A field of a host buffer, as a writable NumPy view."""
        offset, shape = self.fields[name]
        return buffer[offset:offset + int(np.prod(shape))].reshape(shape)

    def views(self, buffer: torch.Tensor) -> StepTensors:
        """The fields of a device (or host) buffer of :attr:`size` int64 elements, as views."""
        if buffer.dtype != torch.int64 or buffer.shape != (self.size,):
            raise ValueError(f"the bucket's buffer is [{self.size}] int64, got {tuple(buffer.shape)} "
                             f"{buffer.dtype}")
        parts = {name: buffer[off:off + int(np.prod(shape))].view(shape)
                 for name, (off, shape) in self.fields.items()}
        return StepTensors(**parts)


def tree_bits(parents: Sequence[int] | None, n: int, words: int) -> np.ndarray:
    """``[n, words]`` int64: bit ``j`` (word ``j // 64``, bit ``j % 64``) of row ``i`` is set when row
    ``j`` is ``i`` or an ancestor of ``i`` (``parents`` None: a causal chain, every ``j <= i``).

    Example: parents ``[-1, 0, 0, 1]`` -> rows ``0b0001, 0b0011, 0b0101, 0b1011``."""
    if n > 64 * words:
        raise ValueError(f"{n} rows need more than {words} words of tree bits")
    reach = np.zeros((n, 64 * words), dtype=bool)
    if parents is None:
        reach[:, :n] = np.tril(np.ones((n, n), dtype=bool))
    else:
        for i, p in enumerate(parents):
            if p >= 0:
                reach[i] = reach[p]
            reach[i, i] = True
    packed = np.packbits(reach, axis=1, bitorder="little")  # [n, 8 * words] uint8, bit j at byte j // 8
    return packed.view("<u8").view(np.int64).reshape(n, words)


def lay_out(pool: SlotPool, seqs: Sequence[SeqRows], bucket: Bucket, scratch: int,
            out: np.ndarray | None = None) -> np.ndarray:
    """The host buffer (``[InputTable.size]`` int64; ``out`` when given) of a step of ``seqs`` in
    ``bucket``. Every slot must already have room for its rows (``pool.ensure``); ``scratch`` is the
    slot padding rows write to, which no sequence of the step may use. No sequences: every row is
    padding (what a graph is warmed up and captured on: it writes to the scratch slot alone)."""
    table = InputTable(bucket, len(pool.groups))
    rows = sum(len(s.tokens) for s in seqs)
    if len(seqs) > bucket.seqs or rows > bucket.rows:
        raise ValueError(f"{len(seqs)} sequences of {rows} rows do not fit the bucket {bucket}")
    slots = [s.slot for s in seqs]
    if len(set(slots)) != len(slots):
        raise ValueError("a sequence may appear only once in a step")
    if scratch in slots:
        raise ValueError(f"slot {scratch} is the scratch slot: no sequence may use it")
    buf = np.zeros(table.size, dtype=np.int64) if out is None else out
    if buf.shape != (table.size,) or buf.dtype != np.int64:
        raise ValueError(f"the host buffer must be [{table.size}] int64")
    f = {name: table.host(buf, name) for name in table.fields}
    r_all = np.arange(bucket.rows, dtype=np.int64)
    # padding everywhere first; the sequences' rows overwrite their part
    buf[:] = 0
    f["row_slot"][:] = scratch
    f["write_slot"][:] = scratch
    f["row_first"][:] = r_all
    f["row_bits"][:, 0] = 1
    f["row_seq"][:] = -1
    f["seq_first"][:] = rows
    f["seq_slot"][:] = scratch
    for g, group in enumerate(pool.groups):
        f["write_entry"][g] = r_all % group.capacity
    r0 = 0
    for s_index, s in enumerate(seqs):
        if not (0 <= s.slot < pool.slots and pool.used[s.slot]):
            raise ValueError(f"slot {s.slot} is not allocated")
        n = len(s.tokens)
        r1 = r0 + n
        past = int(pool.length[s.slot])
        bits = tree_bits(s.parents, n, bucket.words)
        # the row and its ancestors, counted from the bits: depth = that count - 1 (ragged's rule)
        depth = np.unpackbits(bits.view(np.uint8).reshape(n, -1), axis=1).sum(axis=1).astype(np.int64) - 1
        f["input_ids"][r0:r1] = np.asarray(s.tokens, dtype=np.int64)
        f["positions"][r0:r1] = past + depth
        f["row_slot"][r0:r1] = s.slot
        f["write_slot"][r0:r1] = s.slot
        f["row_first"][r0:r1] = r0
        f["row_bits"][r0:r1] = bits
        f["row_seq"][r0:r1] = s_index
        for g, group in enumerate(pool.groups):
            start = int(group.start[s.slot])
            entries = past - start + np.arange(n, dtype=np.int64)
            if entries[-1] >= group.capacity:
                raise ValueError(f"slot {s.slot} has no room for {n} more rows (pool.ensure first)")
            f["cache_len"][g, r0:r1] = past - start
            f["cache_start"][g, r0:r1] = start
            f["write_entry"][g, r0:r1] = entries
        f["seq_first"][s_index] = r0
        f["seq_rows"][s_index] = n
        f["seq_slot"][s_index] = s.slot
        r0 = r1
    return buf
