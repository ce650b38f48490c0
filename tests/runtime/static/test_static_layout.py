"""Buckets and the static layout: which bucket a step takes, where each row's inputs go in the one
buffer, padding rows aimed at the scratch slot, sliding groups that dropped entries, and the
mistakes the layout refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lookupspec.runtime import LayerSpec, SeqRows, SlotPool
from lookupspec.runtime.static import Bucket, BucketConfig, InputTable, lay_out, tree_bits


def test_the_smallest_bucket_that_holds_the_step() -> None:
    cfg = BucketConfig()
    assert cfg.choose(1, 1) == Bucket(1, 1)
    assert cfg.choose(17, 1) == Bucket(32, 1)  # a 16-node tree and its root
    assert cfg.choose(64, 8) == Bucket(64, 8)  # 8 sequences x 8 rows
    assert cfg.choose(9, 3) == Bucket(16, 4)
    assert cfg.choose(3, 5) is None and "cannot hold" in cfg.why_not(3, 5)
    assert cfg.choose(513, 1) is None and "largest bucket" in cfg.why_not(513, 1)
    assert cfg.choose(100, 65) is None and "65 sequences" in cfg.why_not(100, 65)
    every = cfg.all()
    assert every[0] == Bucket(512, 64) and every[-1] == Bucket(1, 1)
    assert all(b.seqs <= b.rows for b in every) and len(every) == len(set(every))


def test_bucket_configurations_are_validated() -> None:
    with pytest.raises(ValueError, match="increasing"):
        BucketConfig(rows=(8, 4))
    with pytest.raises(ValueError, match="too few"):
        BucketConfig(rows=(2, 4), seqs=(4,))
    with pytest.raises(ValueError, match="seqs <= rows"):
        Bucket(2, 4)
    assert BucketConfig(rows=(4, 16), seqs=(2,)).choose(5, 2) == Bucket(16, 2)


def test_tree_bits_hold_each_row_and_its_ancestors() -> None:
    assert tree_bits([-1, 0, 0, 1], 4, 1)[:, 0].tolist() == [0b0001, 0b0011, 0b0101, 0b1011]
    assert tree_bits(None, 3, 1)[:, 0].tolist() == [0b001, 0b011, 0b111]
    chain = tree_bits(None, 70, 2)
    assert chain[69, 0] == -1 and chain[69, 1] == (1 << 6) - 1  # 64 bits set, then 6
    assert chain[63, 1] == 0 and chain[64, 1] == 1
    with pytest.raises(ValueError, match="words"):
        tree_bits(None, 65, 1)


def _pool(windows=(None,), **kw) -> SlotPool:
    return SlotPool([LayerSpec(2, 8, 8, w) for w in windows], dtype=torch.float32, device="cpu", max_batch=8,
                    max_positions=512, **kw)


def test_the_docstring_example() -> None:
    pool = _pool()
    scratch, a, b = pool.allocate(1), pool.allocate(32), pool.allocate(32)
    pool.advance(a, 10)
    pool.advance(b, 4)
    bucket = Bucket(8, 2)
    seqs = [SeqRows(a, [11, 12, 13], [-1, 0, 0]), SeqRows(b, [21])]
    table = InputTable(bucket, len(pool.groups))
    buf = lay_out(pool, seqs, bucket, scratch)
    f = table.views(torch.from_numpy(buf))
    assert f.input_ids.tolist() == [11, 12, 13, 21, 0, 0, 0, 0]
    assert f.positions.tolist() == [10, 11, 11, 4, 0, 0, 0, 0]
    assert f.row_slot.tolist() == [a, a, a, b] + [scratch] * 4
    assert f.write_slot.tolist() == f.row_slot.tolist()
    assert f.row_first.tolist() == [0, 0, 0, 3, 4, 5, 6, 7]  # a padding row is its own sequence
    assert f.row_bits[:, 0].tolist() == [0b001, 0b011, 0b101, 1, 1, 1, 1, 1]
    cap = pool.groups[0].capacity
    assert f.write_entry[0].tolist() == [10, 11, 12, 4] + [r % cap for r in range(4, 8)]
    assert f.cache_len[0].tolist() == [10, 10, 10, 4, 0, 0, 0, 0]
    assert f.cache_start[0].tolist() == [0] * 8
    assert f.row_seq.tolist() == [0, 0, 0, 1, -1, -1, -1, -1]
    assert f.seq_first.tolist() == [0, 3] and f.seq_rows.tolist() == [3, 1] and f.seq_slot.tolist() == [a, b]


def test_every_field_has_its_own_place_in_the_buffer() -> None:
    table = InputTable(Bucket(128, 16), groups=2)
    covered = np.zeros(table.size, dtype=int)
    for offset, shape in table.fields.values():
        assert offset % 2 == 0  # 16-byte aligned
        covered[offset:offset + int(np.prod(shape))] += 1
    assert covered.max() == 1 and covered.sum() >= table.size - len(table.fields)
    views = table.views(torch.zeros(table.size, dtype=torch.int64))
    assert views.row_bits.shape == (128, 2) and views.write_entry.shape == (2, 128)
    assert views.seq_slot.shape == (16,)
    with pytest.raises(ValueError, match="int64"):
        table.views(torch.zeros(table.size, dtype=torch.int32))


def test_padding_only_is_a_valid_step_that_touches_the_scratch_slot_alone() -> None:
    pool = _pool(windows=(None, 6))
    scratch = pool.allocate(1)
    table = InputTable(Bucket(4, 1), len(pool.groups))
    f = table.views(torch.from_numpy(lay_out(pool, [], Bucket(4, 1), scratch)))
    assert set(f.write_slot.tolist()) == {scratch} and set(f.row_slot.tolist()) == {scratch}
    assert f.cache_len.abs().sum() == 0 and f.seq_rows.tolist() == [0]
    assert f.write_entry.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]  # distinct entries: no write races


def test_a_sliding_group_that_dropped_entries_counts_from_its_start() -> None:
    pool = _pool(windows=(None, 6), max_rows=4)
    scratch, s = pool.allocate(1), pool.allocate(1)
    for _ in range(30):  # grow in forwards of at most 4 rows: the sliding group drops old entries
        pool.ensure(s, int(pool.length[s]) + 3)
        pool.advance(s, 3)
    pool.ensure(s, int(pool.length[s]) + 2)
    full, sliding = pool.groups
    start = int(sliding.start[s])
    assert full.window is None and start > 0
    bucket = Bucket(2, 1)
    f = InputTable(bucket, 2).views(torch.from_numpy(lay_out(pool, [SeqRows(s, [5, 6])], bucket, scratch)))
    assert f.cache_len.tolist() == [[90, 90], [90 - start] * 2]
    assert f.cache_start.tolist() == [[0, 0], [start, start]]
    assert f.write_entry.tolist() == [[90, 91], [90 - start, 91 - start]]
    assert f.positions.tolist() == [90, 91]


def test_the_layout_refuses_what_would_break_other_sequences() -> None:
    pool = _pool()
    scratch, a = pool.allocate(1), pool.allocate(8)
    bucket = Bucket(4, 2)
    with pytest.raises(ValueError, match="only once"):
        lay_out(pool, [SeqRows(a, [1]), SeqRows(a, [2])], bucket, scratch)
    with pytest.raises(ValueError, match="scratch"):
        lay_out(pool, [SeqRows(scratch, [1])], bucket, scratch)
    with pytest.raises(ValueError, match="do not fit"):
        lay_out(pool, [SeqRows(a, [1] * 5)], bucket, scratch)
    with pytest.raises(ValueError, match="not allocated"):
        lay_out(pool, [SeqRows(5, [1])], bucket, scratch)
    pool.advance(a, pool.groups[0].capacity - 1)
    with pytest.raises(ValueError, match="no room"):  # pool.ensure was not called
        lay_out(pool, [SeqRows(a, [1, 2])], bucket, scratch)
