"""The KV slot pool against a plain reference: random sequences of allocate, forward writes, commits,
truncation, tree compaction, prefix copies and frees, with capacities small enough to grow (and
sliding-window layers small enough to drop old entries) all the time."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lookupspec.runtime.kvpool import LayerSpec, PoolFull, SlotPool

WINDOW = 5
LAYERS = [LayerSpec(2, 3, 3), LayerSpec(2, 3, 3, WINDOW), LayerSpec(2, 3, 3), LayerSpec(1, 2, 4, WINDOW)]


class Reference:
    """slot -> the value written at each committed position (one float per position: every entry of
    that position, in every layer, key and value, holds a function of it)."""

    def __init__(self) -> None:
        self.seqs: dict[int, list[float]] = {}


def _fill(layer: int, value: float, kind: int) -> float:
    return value * 10 + layer + 0.5 * kind


def _write(pool: SlotPool, slot: int, values: list[float]) -> None:
    """What a forward does: entries for positions length .. length + n, in every layer."""
    base = int(pool.length[slot])
    with torch.inference_mode():
        for layer in range(len(LAYERS)):
            for i, v in enumerate(values):
                e = pool.entry(slot, layer, base + i)
                pool.keys(layer)[slot, :, e] = _fill(layer, v, 0)
                pool.values(layer)[slot, :, e] = _fill(layer, v, 1)


def _check(pool: SlotPool, ref: Reference) -> None:
    for slot, seq in ref.seqs.items():
        assert pool.used[slot] and int(pool.length[slot]) == len(seq)
        for layer, spec in enumerate(LAYERS):
            first = 0 if spec.window is None else max(0, len(seq) - (spec.window - 1))
            for p in range(first, len(seq)):
                e = pool.entry(slot, layer, p)
                assert 0 <= e < pool.group(layer).capacity
                assert torch.all(pool.keys(layer)[slot, :, e] == _fill(layer, seq[p], 0)), (slot, layer, p)
                assert torch.all(pool.values(layer)[slot, :, e] == _fill(layer, seq[p], 1)), (slot, layer, p)


ops = st.lists(st.tuples(st.sampled_from(["alloc", "write", "step", "truncate", "copy", "free"]),
                         st.integers(0, 7), st.integers(0, 7), st.integers(1, 9)), min_size=1, max_size=40)


PER_POSITION = 3 * 2 * 6 * 4 + 1 * 6 * 4  # bytes: three layers of 2 heads x (3 + 3), one of 1 x (2 + 4)


# bytes per position of the two full layers, and of the two sliding groups together
FULL_PER_POSITION, SLIDING_PER_POSITION = 2 * 2 * 6 * 4, 1 * 2 * 6 * 4 + 1 * 6 * 4
MAX_ROWS = 9  # the most rows the program's forwards write at once (its n)


@pytest.mark.parametrize("reserved", [False, True, "windowed"], ids=["growing", "reserved", "windowed"])
@settings(max_examples=60, deadline=None)
@given(ops, st.randoms(use_true_random=False))
def test_pool_matches_a_plain_reference(reserved, program, rnd) -> None:
    if reserved == "windowed":  # sliding layers sized for W - 1 + MAX_ROWS entries: 64 positions a slot
        per_slot = 64 * FULL_PER_POSITION + (WINDOW - 1 + MAX_ROWS) * SLIDING_PER_POSITION
        pool = SlotPool(LAYERS, dtype=torch.float32, max_batch=4, max_positions=64, initial_capacity=2,
                        align=1, max_bytes=4 * per_slot, max_rows=MAX_ROWS)
        assert pool.slot_positions == 64
        pool.reserve()
        assert pool.slots == 4 and pool.nbytes == 4 * per_slot
        assert [g.capacity for g in pool.groups] == [64, WINDOW - 1 + MAX_ROWS, WINDOW - 1 + MAX_ROWS]
    elif reserved:  # a budget of 64 positions for each of 4 slots, all allocated at once
        pool = SlotPool(LAYERS, dtype=torch.float32, max_batch=4, max_positions=64, initial_capacity=2,
                        align=1, max_bytes=4 * 64 * PER_POSITION)
        assert pool.slot_positions == 64
        pool.reserve()
        assert pool.slots == 4 and pool.nbytes == 4 * 64 * PER_POSITION
    else:
        pool = SlotPool(LAYERS, dtype=torch.float32, max_batch=4, max_positions=64, initial_capacity=2,
                        align=1)
    generation = pool.generation
    ref = Reference()
    counter = [0.0]

    def fresh(n: int) -> list[float]:
        out = [counter[0] + i + 1 for i in range(n)]
        counter[0] += n
        return out

    for op, a, b, n in program:
        live = sorted(ref.seqs)
        if op == "alloc":
            try:
                slot = pool.allocate(n)
            except PoolFull:
                assert len(live) == 4
                continue
            assert slot not in ref.seqs
            ref.seqs[slot] = []
        elif not live:
            continue
        elif op == "write":  # a prefill chunk: written, then committed
            slot = live[a % len(live)]
            if len(ref.seqs[slot]) + n > 64:
                continue
            pool.ensure(slot, len(ref.seqs[slot]) + n)
            vals = fresh(n)
            _write(pool, slot, vals)
            pool.advance(slot, n)
            ref.seqs[slot].extend(vals)
        elif op == "step":  # root + n - 1 draft nodes, a random accepted path, compaction, truncation
            slot = live[a % len(live)]
            L = len(ref.seqs[slot])
            if L + n > 64:
                continue
            pool.ensure(slot, L + n)
            vals = fresh(n)
            _write(pool, slot, vals)
            pool.advance(slot, n)
            nodes = sorted(rnd.sample(range(n - 1), rnd.randint(0, n - 1)))
            acc = torch.tensor([[*nodes, *[-1] * (n - 1 - len(nodes))]]) if n > 1 else torch.zeros((1, 0))
            pool.compact([slot], acc.long(), torch.tensor([len(nodes)]), [L + 1])
            pool.truncate(slot, L + 1 + len(nodes))
            ref.seqs[slot].extend([vals[0], *[vals[1 + j] for j in nodes]])
        elif op == "truncate":
            slot = live[a % len(live)]
            keep = max(0, len(ref.seqs[slot]) - n)
            if any(pool.start(slot, layer) > max(0, keep - (WINDOW - 1)) for layer in (1, 3)):
                with pytest.raises(ValueError, match="no longer holds"):
                    pool.truncate(slot, keep)
                continue
            pool.truncate(slot, keep)
            del ref.seqs[slot][keep:]
        elif op == "copy":
            src = live[a % len(live)]
            others = [s for s in live if s != src]
            if not others:
                continue
            dst = others[b % len(others)]
            length = min(n * 3, len(ref.seqs[src]))
            oldest_needed = max(0, length - (WINDOW - 1))
            if any(pool.start(src, layer) > oldest_needed for layer in range(len(LAYERS))):
                with pytest.raises(ValueError, match="no longer holds"):
                    pool.copy_prefix(src, dst, length)
                continue
            pool.copy_prefix(src, dst, length)
            ref.seqs[dst] = list(ref.seqs[src][:length])
        elif op == "free":
            slot = live[a % len(live)]
            pool.free(slot)
            del ref.seqs[slot]
        _check(pool, ref)
        if reserved:
            assert pool.generation == generation  # nothing was reallocated


def test_sliding_layers_keep_only_what_the_window_needs() -> None:
    pool = SlotPool([LayerSpec(1, 2, 2, 8), LayerSpec(1, 2, 2)], dtype=torch.float32, max_positions=4096,
                    initial_capacity=16, align=16)
    slot = pool.allocate(16)
    for _ in range(100):  # 1000 positions, 10 at a time
        pool.ensure(slot, int(pool.length[slot]) + 10)
        pool.advance(slot, 10)
    assert pool.group(1).capacity >= 1000
    assert pool.group(0).capacity <= 32  # W - 1 kept plus the rows in flight, rounded


def test_sliding_layers_sized_for_a_forward_leave_the_budget_to_full_layers() -> None:
    """With ``max_rows`` a sliding group's slot holds W - 1 + max_rows entries, the full groups get
    the rest of the budget, a sequence grows to its whole share without a reallocation, and a forward
    wider than ``max_rows`` is refused rather than given room the budget does not have."""
    sliding, full = LayerSpec(1, 4, 4, window=20), LayerSpec(1, 4, 4)
    per_position = 2 * 4 * 4
    budget = 2 * 256 * 2 * per_position  # two slots of 256 positions in both layers, counted at full length
    plain = SlotPool([sliding, full], dtype=torch.float32, max_batch=2, max_positions=1024, align=8,
                     max_bytes=budget)
    assert plain.slot_positions == 256
    pool = SlotPool([sliding, full], dtype=torch.float32, max_batch=2, max_positions=1024, align=8,
                    max_bytes=budget, max_rows=16)
    assert pool.window_entries(20) == 40 and pool.window_entries(None) == 1024  # 19 + 16, rounded to 8
    assert pool.slot_positions == 472  # (2 x 256 - 40) entries of the full layer, in multiples of 8
    pool.reserve()
    assert [g.capacity for g in pool.groups] == [40, 472] and pool.nbytes <= budget
    generation = pool.generation
    slot = pool.allocate(472)  # room ahead for the whole sequence: the sliding group needs no more
    while int(pool.length[slot]) + 16 <= 472:  # forwards of 16 rows, 3 of them rejected drafts
        pool.ensure(slot, int(pool.length[slot]) + 16)
        pool.advance(slot, 16)
        pool.truncate(slot, int(pool.length[slot]) - 3)
    assert int(pool.length[slot]) > 450 and int(pool.length[slot]) - pool.start(slot, 0) <= 40
    assert pool.generation == generation and pool.resizes == 1
    other = pool.allocate(8)
    pool.ensure(other, 30)  # wider than max_rows, but nothing held yet: it fits the 40 entries
    pool.advance(other, 30)
    with pytest.raises(ValueError, match=r"30 rows .* exceeds the 16 rows"):  # 19 kept + 30 > 40
        pool.ensure(other, 60)


def test_gemma3_1b_shape_gets_five_times_the_positions_with_sliding_layers_at_their_window() -> None:
    """The module docstring's example: 26 layers of one 256-wide head in bfloat16, 22 sliding at 512,
    16 slots of a 32k context in 1 GiB."""
    layers = [LayerSpec(1, 256, 256, None if (i + 1) % 6 == 0 else 512) for i in range(26)]
    shares = [SlotPool(layers, dtype=torch.bfloat16, max_batch=16, max_positions=32768, max_bytes=2**30,
                       max_rows=rows, initial_capacity=64).slot_positions for rows in (None, 257)]
    assert shares == [2496, 12160]


def test_reserving_takes_the_whole_budget_at_once_and_growth_is_counted() -> None:
    spec = LayerSpec(1, 4, 4)
    per_position = 2 * 4 * 4
    with pytest.raises(ValueError, match="byte budget"):
        SlotPool([spec], dtype=torch.float32, max_batch=2).reserve()
    growing = SlotPool([spec], dtype=torch.float32, max_batch=4, max_positions=256, initial_capacity=8,
                       align=8)
    assert growing.resizes == 0
    for _ in range(3):
        growing.ensure(growing.allocate(8), 100)
    assert growing.resizes >= 3 and growing.resize_s > 0  # two slot doublings, one capacity growth at least
    pool = SlotPool([spec], dtype=torch.float32, max_batch=3, max_positions=256, initial_capacity=8, align=8,
                    max_bytes=3 * 100 * per_position)
    assert pool.slot_positions == 96 and pool.slots == 1
    pool.reserve()
    assert (pool.slots, pool.group(0).capacity, pool.resizes) == (3, 96, 1)
    assert pool.nbytes == 3 * 96 * per_position <= pool.max_bytes
    generation = pool.generation
    slots = [pool.allocate(96) for _ in range(3)]
    for slot in slots:
        pool.ensure(slot, 96)
    assert pool.generation == generation and pool.resizes == 1
    with pytest.raises(PoolFull, match="share of the KV budget"):
        pool.ensure(slots[0], 97)
    pool.reserve()  # again: nothing left to allocate
    assert pool.resizes == 1


def test_budget_and_window_end_growth_with_pool_full() -> None:
    spec = LayerSpec(1, 4, 4)
    pool = SlotPool([spec], dtype=torch.float32, max_batch=2, max_positions=100, initial_capacity=8, align=8,
                    max_bytes=2 * 64 * 8 * 4)  # two slots of 64 positions
    assert pool.slot_positions == 64
    a = pool.allocate(8)
    with pytest.raises(PoolFull, match="context window"):
        pool.ensure(a, 101)
    pool.ensure(a, 64)
    b = pool.allocate(8)
    with pytest.raises(PoolFull, match="share of the KV budget"):
        pool.ensure(b, 65)  # 2 slots x 72 entries would exceed the budget
    with pytest.raises(PoolFull, match="cannot give"):
        SlotPool([spec], dtype=torch.float32, max_batch=4, max_bytes=100, align=8)
    with pytest.raises(PoolFull, match="slots are in use"):
        pool.allocate(1)
    pool.free(a)
    assert pool.allocate(1) == a
    with pytest.raises(ValueError, match="not allocated"):
        pool.truncate(3, 0)
