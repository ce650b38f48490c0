"""Composer: budget, no duplicate siblings, score order, closure under parents, merging, feedback."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lookupspec.drafting import (
    AcceptanceStats,
    Candidate,
    Composer,
    DraftTree,
    LookupDrafter,
)
from lookupspec.index import ContextIndex, CorpusIndex, LookupConfig, OutputIndex


class FixedDrafter:
    """A drafter that proposes given candidates (what a draft model would plug in)."""

    def __init__(self, name: str, cands: list[Candidate]) -> None:
        self.name = name
        self.cands = cands
        self.seen: list[tuple[list[int], list[float], list[bool]]] = []

    def propose(self, tail: np.ndarray, budget: int) -> list[Candidate]:
        return self.cands

    def observe(self, match_len: np.ndarray, predicted: np.ndarray, accepted: np.ndarray,
                depth: np.ndarray | None = None) -> None:
        self.seen.append((match_len.tolist(), predicted.tolist(), accepted.tolist()))


def _cand(source: str, tokens: list[int], parents: list[int], scores: list[float],
          match_len: int = 3) -> Candidate:
    s = np.array(scores, np.float32)
    return Candidate(source, match_len, np.array(tokens, np.int32), np.array(parents, np.int32), s, s, s)


def _check_tree(tree: DraftTree, budget: int) -> None:
    n = len(tree)
    assert n <= budget
    seen = set()
    for i in range(n):
        p = int(tree.parents[i])
        assert -1 <= p < i
        assert (p, int(tree.tokens[i])) not in seen, "duplicate siblings"
        seen.add((p, int(tree.tokens[i])))
        assert tree.depth[i] == (1 if p < 0 else tree.depth[p] + 1)
        if p >= 0:
            assert tree.score[i] <= tree.score[p]
    assert np.all(np.diff(tree.score) <= 0), "nodes ordered by score"


def test_worked_example_from_the_docstring() -> None:
    context = FixedDrafter("context", [_cand("context", [1, 2], [-1, 0], [0.8, 0.6])])
    corpus = FixedDrafter("corpus", [_cand("corpus", [1, 3, 4], [-1, 0, -1], [0.7, 0.5, 0.4])])
    tree = Composer([context, corpus]).compose([9, 9], 3)
    assert tree.tokens.tolist() == [1, 2, 3]
    assert tree.parents.tolist() == [-1, 0, 0]
    assert tree.sources() == ["context", "context", "corpus"]
    assert tree.expected_accepted == pytest.approx(1.9)
    _check_tree(tree, 3)


def test_shared_prefixes_merge_and_keep_the_best_score() -> None:
    a = FixedDrafter("a", [_cand("a", [5, 6, 7], [-1, 0, 1], [0.5, 0.4, 0.3], match_len=2)])
    b = FixedDrafter("b", [_cand("b", [5, 6, 8], [-1, 0, 1], [0.9, 0.2, 0.1], match_len=7)])
    tree = Composer([a, b]).compose(np.array([1], np.int32), 10)
    assert tree.tokens.tolist() == [5, 6, 7, 8]
    assert tree.parents.tolist() == [-1, 0, 1, 1]
    assert tree.score.tolist() == pytest.approx([0.9, 0.4, 0.3, 0.1])
    assert tree.sources() == ["b", "a", "a", "b"]
    assert tree.match_len.tolist() == [7, 2, 2, 7]


def test_empty_when_nothing_matches_or_no_budget() -> None:
    empty = FixedDrafter("x", [])
    assert len(Composer([empty]).compose([1, 2], 8)) == 0
    full = FixedDrafter("y", [_cand("y", [1], [-1], [0.5])])
    tree = Composer([full]).compose([1, 2], 0)
    assert len(tree) == 0 and tree.source_names == ("y",)


def test_min_score_and_chain_only() -> None:
    d = FixedDrafter("d", [_cand("d", [1, 2, 3, 4], [-1, 0, 0, 1], [0.9, 0.5, 0.6, 0.05])])
    tree = Composer([d], min_score=0.3).compose([0], 10)
    assert tree.tokens.tolist() == [1, 3, 2]
    chain = Composer([d]).compose([0], 10, chain_only=True)
    assert chain.tokens.tolist() == [1, 3]  # follows the best child at each level
    assert chain.is_chain


def test_prefix_is_a_tree_and_the_best_of_its_size() -> None:
    d = FixedDrafter("d", [_cand("d", [1, 2, 3, 4, 5], [-1, 0, 0, 1, -1], [0.9, 0.5, 0.6, 0.45, 0.55])])
    tree = Composer([d]).compose([0], 10)
    for k in range(len(tree) + 1):
        sub = tree.prefix(k)
        _check_tree(sub, k)
    assert tree.prefix(2).tokens.tolist() == [1, 3]


def test_duplicate_drafter_names_are_rejected() -> None:
    with pytest.raises(ValueError):
        Composer([FixedDrafter("a", []), FixedDrafter("a", [])])


@st.composite
def _random_candidates(draw: st.DrawFn) -> list[Candidate]:
    out = []
    for k in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 12))
        toks, pars, scores = [], [], []
        for i in range(n):
            p = draw(st.integers(-1, i - 1))
            toks.append(draw(st.integers(0, 3)))
            pars.append(p)
            cond = draw(st.floats(0.01, 0.99))
            scores.append(cond * (scores[p] if p >= 0 else 1.0))
        out.append(_cand(f"s{k % 2}", toks, pars, scores))
    return out


@settings(max_examples=200, deadline=None)
@given(_random_candidates(), st.integers(1, 30))
def test_any_candidates_give_a_valid_tree_within_budget(cands: list[Candidate], budget: int) -> None:
    drafters = [FixedDrafter("s0", [c for c in cands if c.source == "s0"]),
                FixedDrafter("s1", [c for c in cands if c.source == "s1"])]
    tree = Composer(drafters).compose([0], budget)
    _check_tree(tree, budget)
    # every path of the tree exists in some candidate, and the tree holds the highest-scoring nodes
    paths = {}
    for c in cands:
        keys: list[tuple[int, ...]] = []
        for i in range(len(c)):
            p = int(c.parents[i])
            key = (*(keys[p] if p >= 0 else ()), int(c.tokens[i]))
            keys.append(key)
            paths[key] = max(paths.get(key, 0.0), float(c.score[i]))
    got: list[tuple[int, ...]] = []
    for i in range(len(tree)):
        p = int(tree.parents[i])
        key = (*(got[p] if p >= 0 else ()), int(tree.tokens[i]))
        got.append(key)
        assert float(tree.score[i]) == pytest.approx(paths[key])
    assert len(tree) == min(budget, len(paths))
    left_out = sorted((s for k, s in paths.items() if k not in set(got)), reverse=True)
    if left_out:
        assert left_out[0] <= float(tree.score.min()) + 1e-6


def test_feedback_reaches_the_tested_nodes_of_each_source() -> None:
    a = FixedDrafter("a", [_cand("a", [1, 2, 3], [-1, 0, 1], [0.9, 0.8, 0.7], match_len=4)])
    b = FixedDrafter("b", [_cand("b", [1, 5, 6], [-1, 0, -1], [0.5, 0.45, 0.3], match_len=2)])
    comp = Composer([a, b])
    tree = comp.compose([0], 10)
    assert tree.tokens.tolist() == [1, 2, 3, 5, 6]
    comp.observe(tree, [0, 1])  # accepted 1 -> 2; 3 (child of 2) and 5 (child of 1) were tested too
    assert a.seen == [([4, 4, 4], pytest.approx([0.9, 0.8, 0.7]), [True, True, False])]
    assert b.seen == [([2, 2], pytest.approx([0.45, 0.3]), [False, False])]
    with pytest.raises(ValueError):
        comp.observe(tree, [7])


def test_lookup_drafters_end_to_end() -> None:
    ctx = ContextIndex([1, 2, 3, 4, 9, 1, 2, 3, 5, 1, 2, 3])
    corpus = CorpusIndex()
    corpus.add_document("a", [2, 3, 4, 7, 7])
    corpus.add_document("b", [2, 3, 6])
    outputs = OutputIndex(100)
    outputs.append([1, 2, 3, 4, 8])
    cfg = LookupConfig(max_depth=4)
    comp = Composer([LookupDrafter((ctx,), cfg, name="context"),
                     LookupDrafter((corpus,), cfg, name="corpus"),
                     LookupDrafter((outputs,), cfg, name="output")])
    tree = comp.compose(ctx.tokens, 8)
    _check_tree(tree, 8)
    assert set(tree.sources()) == {"context", "corpus", "output"}
    assert tree.tokens[:3].tolist() == [4, 5, 6]  # 4 follows "1 2 3" in context and outputs


def test_statistics_calibrate_scores() -> None:
    outputs = OutputIndex(100)
    outputs.append([1, 2, 3, 4, 8])
    stats = AcceptanceStats()
    comp = Composer([LookupDrafter((outputs,), LookupConfig(max_depth=2), stats=stats, name="output")])
    before = comp.compose([1, 2, 3], 8)
    assert before.tokens.tolist() == [4, 8]
    for _ in range(20):  # the target keeps accepting the whole chain
        comp.observe(comp.compose([1, 2, 3], 8), [0, 1])
    after = comp.compose([1, 2, 3], 8)
    assert stats.acceptance_rate(3) == 1.0
    assert after.score[0] > before.score[0]
    assert after.expected_accepted > 1.5


def test_fast_and_slow_paths_build_the_same_tree() -> None:
    rng = np.random.default_rng(0)
    seq = rng.integers(0, 4, 400)
    ctx = ContextIndex(seq)
    corpus = CorpusIndex()
    corpus.add_documents((str(i), rng.integers(0, 4, 50)) for i in range(5))
    cfg = LookupConfig(max_depth=5, max_nodes=20)

    class Slow:
        def __init__(self, inner) -> None:
            self.inner = inner
            self.name = inner.name

        def propose(self, tail: np.ndarray, budget: int) -> list[Candidate]:
            return self.inner.propose(tail, budget)

        def observe(self, *args: np.ndarray) -> None:
            self.inner.observe(*args)

    fast = Composer([LookupDrafter((ctx,), cfg, name="context"),
                     LookupDrafter((corpus,), cfg, name="corpus")])
    slow = Composer([Slow(d) for d in fast.drafters])
    for i in range(50, 400, 7):
        a = fast.compose(seq[:i], 12)
        b = slow.compose(seq[:i], 12)
        assert a.tokens.tolist() == b.tokens.tolist()
        assert a.parents.tolist() == b.parents.tolist()
        np.testing.assert_allclose(a.score, b.score, rtol=1e-6)
