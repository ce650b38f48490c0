"""AcceptanceStats and the count-based scores of lookup candidates."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from lookupspec.drafting import PROB_CAP, AcceptanceStats, score_continuations
from lookupspec.index import Continuations


def test_worked_example_from_the_docstring() -> None:
    s = AcceptanceStats()
    s.observe([8] * 10, [0.5] * 10, [True] * 9 + [False])
    assert s.factor(8) == pytest.approx((9 + 2 * 11 / 7) / 7, rel=1e-5)
    assert 0.5 * s.factor(8) == pytest.approx(0.867, abs=1e-3)
    assert s.factor(3) == pytest.approx(11 / 7, rel=1e-5)  # unobserved length: the pooled ratio
    assert s.acceptance_rate(8) == pytest.approx(0.9)
    assert np.isnan(s.acceptance_rate(2))


def test_factor_starts_neutral_and_match_length_is_clipped() -> None:
    s = AcceptanceStats(max_match=4)
    assert s.factor(2) == 1.0
    s.observe([100], [0.5], [False])
    assert s.tested[4] == 1
    assert s.factor(100) < 1.0
    with pytest.raises(ValueError):
        s.observe([1, 2], [0.5], [True])


def test_observe_is_thread_safe() -> None:
    s = AcceptanceStats()

    def work() -> None:
        for _ in range(500):
            s.observe([3, 4], [0.5, 0.5], [True, False])

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert s.tested.sum() == 4000
    assert s.accepted.sum() == 2000


def test_scores_from_counts_worked_example() -> None:
    # scoring.py: 4 occurrences, x (3) and y (1), x -> z (3)
    cont = Continuations.from_arrays(2, 4, [10, 11, 12], [-1, -1, 0], [3, 1, 3], [5, 6, 7], [1, 1, 2])
    c = score_continuations(cont, "context", AcceptanceStats())
    assert c.predicted.tolist() == pytest.approx([0.6, 0.2, 0.75])
    assert c.score.tolist() == pytest.approx([0.6, 0.2, 0.45])


def test_probabilities_are_capped() -> None:
    s = AcceptanceStats()
    s.observe([5] * 50, [0.5] * 50, [True] * 50)
    cont = Continuations.from_arrays(5, 1, [1, 2], [-1, 0], [1, 1], [1, 2], [1, 2])
    c = score_continuations(cont, "context", s)
    assert c.prob.tolist() == pytest.approx([PROB_CAP, PROB_CAP])
    assert c.score[1] == pytest.approx(PROB_CAP**2)


def test_depth_factors_learn_that_running_copies_keep_being_accepted() -> None:
    s = AcceptanceStats(depth_buckets=4)
    # at match length 6: first tokens past the tail accepted 3/10, deeper ones (parent accepted) 9/10
    s.observe([6] * 20, [0.5] * 20, [True] * 3 + [False] * 7 + [True] * 9 + [False], [1] * 10 + [3] * 10)
    row = s.factors(6)
    assert row.shape == (5,)
    assert row[3] > s.factor(6) > row[1]
    pooled = (12 + 2) / (10 + 2)
    factor = (12 + 2 * pooled) / (10 + 2)
    ratio3 = (9 + 2 * pooled) / (5 + 2) / pooled
    assert s.factor(6) == pytest.approx(factor, rel=1e-5)
    assert row[3] == pytest.approx((9 + 2 * factor * ratio3) / (5 + 2), rel=1e-5)  # stats.py formula
    # no observations at a length: per-depth ratios still apply on top of the pooled factor
    other = s.factors(20)
    assert other[3] > other[1]
    # a depth past the last bucket is clipped into it
    s.observe([6], [0.5], [True], [40])
    assert s.tested_ld[6, 4] == 1


def test_scoring_uses_the_factor_of_each_nodes_depth() -> None:
    s = AcceptanceStats(depth_buckets=4)
    s.observe([2] * 20, [0.5] * 20, [False] * 10 + [True] * 10, [1] * 10 + [2] * 10)
    cont = Continuations.from_arrays(2, 1, [10, 11], [-1, 0], [1, 1], [5, 6], [1, 2])
    c = score_continuations(cont, "context", s)
    row = s.factors(2)
    assert c.predicted.tolist() == pytest.approx([0.5, 0.5])
    assert c.score.tolist() == pytest.approx([0.5 * row[1], 0.5 * row[1] * min(0.98, 0.5 * row[2])], rel=1e-5)
