"""The batch-aware cost model and the draft budget chosen across the batch: the fit recovers a step's
cost terms, the allocation is the single-request rule for one sequence, and trees shrink by
themselves as the batch grows, down to plain decoding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookupspec.cost import BudgetPolicy, StepCostModel, allocate
from lookupspec.drafting.policy import DraftPolicy

# a CPU-like step: 24 ms of weights, 0.6 ms per sequence, 0.5 ms per row, KV reads and attention
TRUE = np.array([0.024, 0.0006, 0.0005, 0.0015, 0.0012])


def _true_cost(rows, ctxs):
    r, c = np.asarray(rows, float), np.asarray(ctxs, float) / 1000
    return float(TRUE @ [1, len(r), r.sum(), c.sum(), (r * c).sum()])


def test_fit_recovers_the_terms_and_ignores_a_stalled_step() -> None:
    rng = np.random.default_rng(0)
    model = StepCostModel()
    for _ in range(300):
        b = int(rng.integers(1, 17))
        rows = rng.integers(1, 17, b).tolist()
        ctxs = rng.integers(100, 3000, b).tolist()
        model.observe(rows, ctxs, _true_cost(rows, ctxs) * float(rng.normal(1.0, 0.01)))
    got = np.array(list(model.coefficients.values()))
    np.testing.assert_allclose(got, TRUE, rtol=0.1, atol=2e-4)
    before = model.predict([1], [1000])
    model.observe([1], [1000], 50 * before)  # another process stalled this step 50x
    assert model.predict([1], [1000]) < 1.05 * before
    assert model.node_cost(1000) == pytest.approx(TRUE[2] + TRUE[4], rel=0.1)
    assert all(v >= 0 for v in model.coefficients.values())


def test_coefficients_stay_non_negative_on_degenerate_data() -> None:
    model = StepCostModel()
    for n in (1, 1, 1, 1, 1, 1):  # one shape only: many solutions, none may be negative
        model.observe([n], [500], 0.03)
    assert model.known() and all(v >= 0 for v in model.coefficients.values())
    assert model.predict([1], [500]) == pytest.approx(0.03, rel=0.05)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=24), st.floats(0.01, 0.1), st.floats(1e-4, 1e-2))
def test_one_sequence_is_the_single_request_rule(raw, base, cost) -> None:
    scores = np.sort(np.asarray(raw))[::-1]
    keep = allocate([scores], [cost], base, 1, None)[0]
    table = np.concatenate(([0.0], base + cost * np.arange(len(scores) + 2)))  # index = rows
    rule = BudgetPolicy().choose(scores, table)
    gain = lambda k: (1 + scores[:k].sum()) / (base + k * cost)  # noqa: E731
    assert gain(keep) == pytest.approx(gain(rule), rel=1e-9)


def _fitted(true: np.ndarray) -> StepCostModel:
    model = StepCostModel()
    rng = np.random.default_rng(1)
    for _ in range(200):
        b = int(rng.integers(1, 65))
        rows = rng.integers(1, 9, b).tolist()
        r, c = np.asarray(rows, float), np.ones(b)
        model.observe(rows, [1000] * b, float(true @ [1, b, r.sum(), c.sum(), (r * c).sum()]))
    return model


def _kept_per_sequence(model: StepCostModel, batches) -> list[float]:
    scores = np.array([0.9, 0.8, 0.6, 0.45, 0.3, 0.2, 0.12, 0.08, 0.05, 0.03])
    kept = []
    for b in batches:
        base = model.predict([1] * b, [1000] * b)
        keep = allocate([scores] * b, [model.node_cost(1000)] * b, base, b, None)
        kept.append(sum(keep) / b)
    return kept


def test_trees_shrink_as_the_batch_grows() -> None:
    """CPU-like costs: a step's weights dominate at batch 1, so wide trees pay; as the batch grows the
    batch's own rate rises and only the best nodes keep paying (each sequence's attention and KV
    reads are a fixed share of a step that a good node still beats)."""
    kept = _kept_per_sequence(_fitted(TRUE), (1, 2, 4, 8, 16, 32, 64, 256))
    assert kept == sorted(kept, reverse=True)  # nodes per sequence never grow with the batch
    assert kept[0] >= 5 and kept[-1] <= 2


def test_a_compute_bound_batch_decodes_plainly() -> None:
    """Costs where rows dominate (a GPU's large batches): the same rule goes down to plain decoding
    by itself, with no batch-size switch."""
    rows_dominate = np.array([0.008, 1e-6, 0.0004, 1e-6, 1e-6])
    kept = _kept_per_sequence(_fitted(rows_dominate), (1, 4, 16, 64, 1024))
    assert kept == sorted(kept, reverse=True)
    assert kept[0] >= 5 and kept[-1] == 0


def test_a_forward_with_a_prompt_chunk_prices_a_node_as_a_chunk_token() -> None:
    """Steps of their own are fitted with cheap rows (the weights dominate); a forward that carries a
    prompt chunk is compute-bound, and there a node costs what a chunk token costs: fewer nodes pay."""
    model = _fitted(TRUE)
    assert model.node_cost(1000, shared=True) == model.node_cost(1000)  # no chunk measured yet
    for _ in range(10):
        model.observe_chunk(100, 0.25)  # 2.5 ms a chunk token
    model.observe_chunk(100, 25.0)  # a forward slowed 100x by another process: capped at 3x
    assert model.chunk_row_s == pytest.approx(0.7 * 0.0025 + 0.3 * 0.0075)
    model.observe_chunk(0, 1.0)
    model.observe_chunk(10, 0.0)  # nothing to learn from either
    assert model.chunk_row_s == pytest.approx(0.004)
    assert model.node_cost(1000, shared=True) == pytest.approx(0.004)
    assert model.node_cost(1000) == pytest.approx(TRUE[2] + TRUE[4], rel=0.1)  # steps alone: unchanged
    scores = np.array([0.9, 0.8, 0.6, 0.45, 0.3, 0.2, 0.12, 0.08, 0.05, 0.03])
    for b in (1, 8):
        base = model.predict([1] * b, [1000] * b)
        alone = sum(allocate([scores] * b, [model.node_cost(1000)] * b, base, b, None))
        shared = sum(allocate([scores] * b, [model.node_cost(1000, True)] * b, base, b, None))
        assert 0 < shared < alone
    model.observe_chunk(100, 0.01)  # cheaper than a row of a step alone: the step's own price holds
    for _ in range(30):
        model.observe_chunk(100, 0.01)
    assert model.node_cost(1000, shared=True) == model.node_cost(1000)


def test_a_row_budget_caps_the_step() -> None:
    scores = [np.array([0.9, 0.9, 0.9, 0.9])] * 4
    keep = allocate(scores, [1e-4] * 4, 0.03, 4, max_rows=10)
    assert sum(keep) + 4 <= 10


def test_a_refused_batch_explores_one_sequence_per_round_whatever_its_size() -> None:
    """The exploration's extra rows do not grow with the batch: 8 refused sequences for 16 steps get
    two explorations of 2 nodes (as one sequence would), on different sequences."""
    from lookupspec.drafting.acceptance import Exploration

    ex = Exploration(every=8, nodes=2)
    explored = []
    for _ in range(16):
        out = ex.adjust_batch([0] * 8, [5] * 8)
        explored += [(i, k) for i, k in enumerate(out) if k]
    assert explored == [(0, 2), (1, 2)]
    assert ex.adjust_batch([0, 3], [4, 4]) == [0, 3]  # a verified tree resets the count
    assert [ex.adjust_batch([0, 0], [0, 1]) for _ in range(8)][-1] == [0, 1]  # never past a tree's size


def test_a_tree_refused_whole_is_not_fed_back_as_rejected() -> None:
    """Only verified nodes are evidence: a refused tree must not lower its sources' statistics."""
    from lookupspec.drafting.policy import Draft

    seen = []

    class Session:
        def feedback(self, tree, accepted):
            seen.append((len(tree.score), list(accepted)))

    class Tree:
        score = np.array([0.9, 0.5])

    policy = DraftPolicy()
    policy.observe(Session(), Draft(draft_s=0.0, tree=Tree()), [])  # refused: zero nodes verified
    assert seen == []
    policy.observe(Session(), Draft([5, 6], [-1, 0], ["context"] * 2, tree=Tree()), [0])
    assert seen == [(2, [0])]


def test_nodes_a_grammar_forbids_take_no_place_in_the_budget() -> None:
    """A sequence's ``allowed`` filter runs before the budget: the draft holds only allowed nodes
    (renumbered, their order kept), a row cap counts allowed nodes, and the verified tree fed back
    (for the calibration and the sources' statistics) is the allowed one, so a forbidden node is never
    counted as rejected."""
    from lookupspec.drafting.base import DraftTree
    from lookupspec.drafting.policy import DraftInputs
    from lookupspec.params import SpecParams
    from lookupspec.sampling import SamplingParams

    tree = DraftTree(np.array([10, 11, 12, 13, 14, 15], np.int32),
                     np.array([-1, 0, -1, 2, 1, 3], np.int32), np.zeros(6, np.int8), np.ones(6, np.int32),
                     np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4], np.float32),
                     np.array([1, 2, 1, 2, 3, 3], np.int32), np.ones(6, np.float32), ("context",))
    fed: list = []

    class Session:
        def propose(self, max_nodes, chain_only=False):
            return tree.prefix(max_nodes)

        def feedback(self, t, accepted):
            fed.append((t.tokens.tolist(), list(accepted)))

    def grammar(t):  # node 0 (token 10) is refused, and with it its subtree (nodes 1 and 4)
        return [i for i in range(len(t.tokens)) if i in (2, 3, 5)]

    def inputs(allowed):
        return DraftInputs(Session(), None, SpecParams(max_draft_tokens=8), SamplingParams(), [1, 2, 3],
                           allowed)

    policy = DraftPolicy(BudgetPolicy(adaptive=False))
    free, = policy.choose_batch([inputs(None)], [6], [100])
    assert free.tokens == [10, 11, 12, 13, 14, 15]
    held, = policy.choose_batch([inputs(grammar)], [6], [100])
    assert (held.tokens, held.parents) == ([12, 13, 15], [-1, 0, 1])
    capped, = policy.choose_batch([inputs(grammar)], [6], [100], max_rows=3)
    assert capped.tokens == [12, 13]  # two allowed nodes, not the refused 10 and 11
    policy.observe(Session(), held, [0, 1])
    assert fed == [([12, 13, 15], [0, 1])]


def test_a_selected_tree_keeps_its_order_and_refuses_orphans() -> None:
    from lookupspec.drafting.base import DraftTree

    tree = DraftTree(np.array([5, 6, 7, 8], np.int32), np.array([-1, 0, 0, 2], np.int32),
                     np.arange(4, dtype=np.int8), np.array([1, 2, 3, 4], np.int32),
                     np.array([0.9, 0.8, 0.7, 0.6], np.float32), np.array([1, 2, 2, 3], np.int32),
                     np.array([0.1, 0.2, 0.3, 0.4], np.float32), ("a", "b", "c", "d"))
    sub = tree.select([0, 2, 3])
    assert sub.tokens.tolist() == [5, 7, 8] and sub.parents.tolist() == [-1, 0, 1]
    assert sub.source.tolist() == [0, 2, 3] and sub.match_len.tolist() == [1, 3, 4]
    assert sub.score.tolist() == pytest.approx([0.9, 0.7, 0.6]) and sub.depth.tolist() == [1, 2, 3]
    assert sub.predicted.tolist() == pytest.approx([0.1, 0.3, 0.4]) and sub.parents.dtype == np.int32
    with pytest.raises(ValueError, match="parents are kept"):
        tree.select([0, 1, 3])  # node 3's parent (2) is not kept
    with pytest.raises(ValueError, match="ascending"):
        tree.select([2, 0])
