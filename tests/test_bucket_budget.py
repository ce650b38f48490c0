"""The draft budget where steps run in buckets (the static step, CUDA graphs): a bucket costs the same
full or not, so the budget fills its free rows with the next-best nodes; each bucket's price is
measured (lookupspec.cost.buckets)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lookupspec.cost import BucketCosts, allocate
from lookupspec.runtime.static import Bucket, BucketConfig

CONFIG = BucketConfig()


def _costs(**seconds: float) -> BucketCosts:
    """Bucket costs with one sequence's buckets of the given rows (``r16=0.002``) measured."""
    costs = BucketCosts(CONFIG.choose)
    for key, s in seconds.items():
        costs.observe(Bucket(int(key[1:]), 1), s)
    return costs


def test_a_bucket_is_priced_by_its_measured_steps_and_a_stalled_one_is_capped() -> None:
    costs = BucketCosts(CONFIG.choose, memory=0.5)
    assert costs.lookup(17, 1) == (32, None) and costs.known() == 0
    costs.observe(Bucket(32, 1), 0.002)
    assert costs.lookup(17, 1) == (32, 0.002) and costs.lookup(32, 1) == (32, 0.002)
    costs.observe(Bucket(32, 1), 0.004)
    assert abs(costs.seconds(Bucket(32, 1)) - 0.003) < 1e-12
    costs.observe(Bucket(32, 1), 10.0)  # another process stalled the step: counted as 3x the average
    assert abs(costs.seconds(Bucket(32, 1)) - 0.0060) < 1e-12
    assert costs.lookup(17, 2) == (32, None)  # another bucket: two sequences' tables
    assert costs.lookup(600, 1) is None  # past the largest bucket
    costs.observe(Bucket(32, 1), 0.0)  # nothing measured: ignored
    assert costs.known() == 1


def test_free_rows_of_a_bucket_take_the_next_best_nodes() -> None:
    scores = [np.array([0.9, 0.8, 0.7, 0.5, 0.3, 0.2, 0.1] + [0.05] * 30)]
    # linear pricing stops where a node's score no longer pays for its row
    alone = allocate(scores, [0.0005], 0.002, 1, None)
    assert 0 < alone[0] < 15
    # in buckets a 16-row step costs little more than an 8-row one: fill it, then stop, since the
    # 32-row bucket costs twice as much
    filled = allocate(scores, [0.0005], 0.002, 1, None,
                      _costs(r1=0.002, r2=0.002, r4=0.0021, r8=0.0022, r16=0.0023, r32=0.0048).lookup_rows(1))
    assert filled == [15]
    # where the 32-row bucket is nearly free too, it is filled as far as the nodes go
    cheap = allocate(scores, [0.0005], 0.002, 1, None,
                     _costs(r1=0.002, r2=0.002, r4=0.002, r8=0.002, r16=0.002, r32=0.00201).lookup_rows(1))
    assert cheap == [31]
    # zero-score nodes never take a row, free or not
    assert allocate([np.array([0.9, 0.0, 0.0])], [0.0005], 0.002, 1, None,
                    _costs(r1=0.002, r2=0.002, r4=0.002).lookup_rows(1)) == [1]


def test_an_unmeasured_bucket_is_priced_by_the_linear_model_at_its_full_size() -> None:
    scores = [np.array([0.9] * 5 + [0.4] * 20)]
    costs = _costs(r1=0.002, r2=0.0022, r4=0.0026)  # 8 rows and up: never measured
    # 8 rows and up are priced as full buckets by the linear model: 16 rows (0.002 + 15 * 0.0002 s)
    # carry 15 nodes, the best rate; 32 rows cost more than their nodes bring
    assert allocate(scores, [0.0002], 0.002, 1, None, costs.lookup_rows(1)) == [15]
    # a max_rows below the bucket caps the step: 5 nodes in the 8-row bucket beat 3 in the 4-row one
    assert allocate(scores, [0.0002], 0.002, 1, 6, costs.lookup_rows(1)) == [5]


def test_a_batch_fills_its_bucket_across_sequences() -> None:
    lists = [np.array([0.9, 0.6, 0.3, 0.2]), np.array([0.8, 0.5, 0.4, 0.1]), np.array([0.7, 0.2])]
    costs = BucketCosts(CONFIG.choose, memory=0.0)
    for rows in (4, 8, 16):
        costs.observe(Bucket(rows, 4), 0.003)
    assert allocate(lists, [0.001] * 3, 0.003, 3, None, costs.lookup_rows(3)) == [4, 4, 2]  # all 10 fit in 16
    costs.observe(Bucket(16, 4), 0.009)  # (memory 0: the last sample, within 3x of the one before)
    # 16 rows now cost too much: the 8-row bucket takes the five best nodes of the three sequences
    assert allocate(lists, [0.001] * 3, 0.003, 3, None, costs.lookup_rows(3)) == [2, 2, 1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=0, max_size=40), st.floats(1e-4, 1e-2), st.floats(1e-5, 1e-3))
def test_without_buckets_the_budget_is_unchanged(raw, base, cost) -> None:
    scores = [np.sort(np.asarray(raw, dtype=np.float64))[::-1]]
    keep = allocate(scores, [cost], base, 1, None)
    # the same prefix rule, recomputed: the k maximizing (1 + sum of the first k) / (base + k cost)
    s = np.clip(scores[0], 0.0, 1.0)
    rates = [(1 + s[:k].sum()) / (base + k * cost) for k in range(len(s) + 1)]
    best = max(rates)
    assert (1 + s[:keep[0]].sum()) / (base + keep[0] * cost) >= best * (1 - 1e-12)
