"""One compaction launch for every layer's keys and values of a slot pool: the Triton kernel, reading
the pool's tensors through their row table, moves exactly what the torch twin moves, in one launch,
for pools of several groups (full and sliding layers, keys and values of different widths)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from lookupspec.kernels import compact_triton

from lookupspec.runtime.kvpool import LayerSpec, SlotPool

SPECS = [LayerSpec(2, 16, 16), LayerSpec(2, 16, 16, window=8), LayerSpec(3, 8, 4), LayerSpec(2, 16, 16)]


class _Counting:
    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


def _pool(gen, device="cpu"):
    pool = SlotPool(SPECS, dtype=torch.float32, device=device, max_batch=4, max_positions=256,
                    initial_capacity=64)
    slots = [pool.allocate(40) for _ in range(3)]
    with torch.inference_mode():  # the pool's tensors are inference tensors
        for g in pool.groups:
            for t in g.tensors:
                t.copy_(torch.randn(t.shape, generator=gen))
    for s in slots:
        pool.advance(s, 20)
    return pool, slots


def test_one_launch_compacts_every_group_like_the_twin(gen, device, monkeypatch):
    accepted = torch.tensor([[1, 3, 4, -1], [0, 1, 2, 3], [2, -1, -1, -1]], device=device)
    num = torch.tensor([3, 4, 1], device=device)
    base = [12, 5, 9]
    ref_pool, slots = _pool(torch.Generator().manual_seed(gen.initial_seed()), device)
    got_pool, _ = _pool(torch.Generator().manual_seed(gen.initial_seed()), device)
    assert len(got_pool.groups) == 3 and sum(len(g.tensors) for g in got_pool.groups) == 4
    ref_pool.compact(slots, accepted, num, base, backend="torch")
    counting = _Counting(compact_triton._compact_pool_kernel)
    per_tensor = _Counting(compact_triton._compact_kernel)
    monkeypatch.setattr(compact_triton, "_compact_pool_kernel", counting)
    monkeypatch.setattr(compact_triton, "_compact_kernel", per_tensor)
    got_pool.compact(slots, accepted, num, base, backend="triton")
    assert (counting.launches, per_tensor.launches) == (1, 0)
    for rg, gg in zip(ref_pool.groups, got_pool.groups, strict=True):
        for rt, gt in zip(rg.tensors, gg.tensors, strict=True):
            assert torch.equal(rt, gt)
    moved = got_pool.keys(0)[slots[0], :, 12 + 1]  # node 3 moved to entry base + 1
    before, _ = _pool(torch.Generator().manual_seed(gen.initial_seed()), device)
    assert torch.equal(moved, before.keys(0)[slots[0], :, 12 + 3])


def test_a_plan_refuses_a_pool_that_grew(gen):
    from lookupspec.kernels import HostStage

    pool, slots = _pool(gen)
    stage = HostStage("cpu")
    plan = pool.plan_compact(slots, [21, 21, 21], stage)
    stage.upload()
    pool.ensure(slots[0], 200)  # reallocates: the table's addresses are stale
    with pytest.raises(RuntimeError, match="stale"):
        pool.compact_planned(plan, torch.zeros(3, 2, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))


@pytest.mark.parametrize("round_", range(12))
def test_the_twins_host_and_device_paths_move_the_same_entries(round_):
    """The twin compacts CPU tensors from moves read on the host, and device tensors with gathers over
    every slot: both leave every tensor of the pool the same, for random paths (chains that do not
    move, trees that do, paths cut short) of a random subset of the slots."""
    from lookupspec.kernels import reference

    gen = torch.Generator().manual_seed(500 + round_)
    m = int(torch.randint(1, 6, (1,), generator=gen))
    pools = [_pool(torch.Generator().manual_seed(round_))[0] for _ in range(2)]
    slots = [0, 2] if round_ % 2 else [1]
    accepted, num = [], []
    for _ in slots:
        nodes = sorted(torch.randperm(m + 2, generator=gen)[:m].tolist())
        count = int(torch.randint(0, m + 1, (1,), generator=gen))
        accepted.append(nodes[:count] + [-1] * (m - count))
        num.append(count)
    base = torch.tensor([[int(torch.randint(5, 16, (1,), generator=gen))] * len(SPECS) for _ in slots])
    tensors = [[t for g in p.groups for t in g.tensors] for p in pools]
    groups = [gi for gi, g in enumerate(pools[0].groups) for _ in g.tensors]
    base = base[:, :len(pools[0].groups)]
    args = (torch.tensor(slots), base, torch.tensor(accepted), torch.tensor(num))
    with torch.inference_mode():
        reference._compact_pool_host(tensors[0], groups, *args)
        reference._compact_pool_device(tensors[1], groups, *args)
    for a, b in zip(*tensors, strict=True):
        assert torch.equal(a, b)
    if any(x != j for path, c in zip(accepted, num, strict=True) for j, x in enumerate(path[:c])):
        fresh = [t for g in _pool(torch.Generator().manual_seed(round_))[0].groups for t in g.tensors]
        assert any(not torch.equal(a, f) for a, f in zip(tensors[0], fresh, strict=True))  # something moved
