"""The adaptivity pieces: the cost model's table, the budget policy's choice, score calibration and
the draft-model gate (lookupspec/cost/)."""

from __future__ import annotations

import numpy as np
import pytest

from lookupspec.cost import BudgetPolicy, CostModel
from lookupspec.drafting.acceptance import DraftModelGate, ScoreCalibration


def test_policy_worked_example_from_the_docstring() -> None:
    costs = np.array([0.0, 0.040, 0.044, 0.046, 0.060])
    assert BudgetPolicy().choose(np.array([0.9, 0.8, 0.1]), costs) == 2
    assert BudgetPolicy(adaptive=False).choose(np.array([0.9, 0.8, 0.1]), costs) == 3
    assert BudgetPolicy().choose(np.array([0.05]), np.array([0.0, 0.040, 0.060])) == 0  # does not pay


def test_cost_table_interpolates_and_is_monotone() -> None:
    cm = CostModel()
    assert not cm.known() and cm.table(4).tolist() == [0.0] * 5
    cm.observe(1, 0.030)
    cm.observe(4, 0.036)
    t = cm.table(8)
    assert t[1] == pytest.approx(0.030) and t[4] == pytest.approx(0.036)
    assert t[2] == pytest.approx(0.032) and np.all(np.diff(t[1:]) >= 0)
    assert t[8] == pytest.approx(0.036 * 8 / 4)  # proportional past the largest measured size


def test_one_slow_sample_at_a_rare_size_does_not_poison_larger_sizes() -> None:
    cm = CostModel()
    cm.observe(1, 0.030)
    for n in (2, 4, 6, 8, 12, 16):
        for _ in range(10):
            cm.observe(n, 0.034 + 0.001 * n)
    cm.observe(10, 0.400)  # a first sample of size 10 while another process hogged the CPU
    t = cm.table(16)
    line = 0.034 + 0.001 * np.arange(17)
    assert t[10] <= 1.1 * line[10] + 1e-9
    assert t[12] == pytest.approx(line[12], rel=0.05) and t[16] == pytest.approx(line[16], rel=0.05)
    assert t[1] == pytest.approx(0.030)


def test_single_samples_cannot_drag_a_known_size() -> None:
    cm = CostModel(alpha=0.5)
    cm.observe(3, 0.010)
    cm.observe(3, 1.000)  # capped at 2x the current mean
    assert cm.table(3)[3] == pytest.approx(0.015)


def test_score_calibration_learns_that_low_scores_are_underestimates() -> None:
    cal = ScoreCalibration(bins=10, prior=4.0, decay=1.0)
    scores = np.array([0.95, 0.85, 0.25, 0.05, 0.04])
    assert cal.apply(scores).tolist() == pytest.approx(scores.tolist())  # neutral before evidence
    rng = np.random.default_rng(0)
    for _ in range(400):
        s = rng.uniform(0, 0.1, 8)
        cal.observe(s, rng.uniform(0, 1, 8) < 0.2)  # scored ~0.05, accepted 20% of the time
    out = cal.apply(scores)
    assert out[3] == pytest.approx(0.2, abs=0.03) and out[4] == pytest.approx(0.16, abs=0.03)
    assert np.all(np.diff(out) <= 0)  # descending input stays descending
    assert out[0] == pytest.approx(0.95)  # unobserved bins stay near their own score
    cal.observe(np.array([]), np.array([], bool))  # nothing verified: no change


def test_draft_model_gate_closes_and_probes() -> None:
    gate = DraftModelGate(probe_every=4)
    for _ in range(30):
        gate.observe(4, 0)
    assert gate.path_scores(4)[0] < 0.1
    gate.steps_since_use = 0
    assert not gate.probe_due()
    gate.steps_since_use = 4
    assert gate.probe_due()


def test_exploration_verifies_the_top_nodes_after_enough_refused_steps():
    from lookupspec.drafting.acceptance import Exploration

    ex = Exploration(every=3, nodes=2)
    assert [ex.adjust(0, 5) for _ in range(3)] == [0, 0, 2]  # the third refused step explores
    assert ex.adjust(0, 0) == 0  # an empty tree is not a refusal
    assert [ex.adjust(0, 1) for _ in range(3)] == [0, 0, 1]  # never more nodes than the tree has
    assert ex.adjust(0, 4) == 0 and ex.adjust(3, 4) == 3  # a chosen draft resets the count
    assert [ex.adjust(0, 4) for _ in range(3)] == [0, 0, 2]
