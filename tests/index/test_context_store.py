"""ContextIndex: hash chains and lookups against the plain reference; appends; ranking."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import configs, tails, token_lists

from lookupspec.index import ContextIndex, LookupConfig
from lookupspec.index.reference import ref_lookup_context, ref_prev_chains


def _same(a, b) -> None:
    assert (a.match_len, a.num_occurrences) == (b.match_len, b.num_occurrences)
    for f in ("tokens", "parents", "counts", "last_seen", "depth"):
        assert getattr(a, f).tolist() == getattr(b, f).tolist(), f


def test_worked_example_from_the_docstring() -> None:
    s = ContextIndex([0, 1, 2, 0, 1, 3, 0, 1])  # a b c a b d a b
    c = s.lookup(s.tokens, LookupConfig(max_depth=1))
    assert c.match_len == 2
    assert c.num_occurrences == 2
    assert c.tokens.tolist() == [3, 2]  # d (more recent) before c: equal counts, recency decides
    assert c.counts.tolist() == [1, 1]
    assert c.last_seen.tolist() == [5, 2]
    assert c.parents.tolist() == [-1, -1]


def test_counts_rank_before_recency() -> None:
    s = ContextIndex([7, 1, 7, 1, 7, 2, 7])
    c = s.lookup(s.tokens, LookupConfig(max_depth=1, max_match=1))
    assert c.tokens.tolist() == [1, 2]  # 1 follows 7 twice, 2 once (more recently)
    assert c.counts.tolist() == [2, 1]


def test_no_match_and_empty_inputs() -> None:
    assert ContextIndex().lookup(np.array([1], np.int32), LookupConfig()).match_len == 0
    s = ContextIndex([1, 2, 3])
    assert s.lookup(np.array([9], np.int32), LookupConfig()).match_len == 0
    assert s.lookup(np.array([], np.int32), LookupConfig()).match_len == 0
    assert len(s.lookup(s.tokens, LookupConfig())) == 0  # 3 occurs only at the end


def test_min_match_rejects_short_matches() -> None:
    s = ContextIndex([1, 2, 3, 9, 3])
    assert s.lookup(s.tokens, LookupConfig(min_match=2)).match_len == 0
    assert s.lookup(s.tokens, LookupConfig(min_match=1)).match_len == 1


def test_single_repeated_token_gives_one_chain_of_max_depth() -> None:
    s = ContextIndex([4] * 100)
    cfg = LookupConfig(max_match=12, max_depth=5, max_occurrences=8)
    c = s.lookup(s.tokens, cfg)
    assert c.match_len == 12
    assert c.tokens.tolist() == [4] * 5
    assert c.parents.tolist() == [-1, 0, 1, 2, 3]
    assert c.num_occurrences == 8  # capped at max_occurrences (the most recent ones)
    assert c.counts.tolist() == [8, 7, 6, 5, 4]  # the most recent occurrences run into the end
    _same(c, ref_lookup_context([4] * 100, [4] * 100, cfg, s.max_ngram))


def test_matches_longer_than_max_ngram_are_found_by_extension() -> None:
    x = list(range(10))
    seq = [*x, 50, 6, 7, 8, 9, 51, 6, 7, 8, 9, 52, *x]
    s = ContextIndex(seq, max_ngram=4)
    c = s.lookup(s.tokens, LookupConfig(max_match=30, max_depth=2))
    assert c.match_len == 10  # only the first copy of x extends past the 4-gram 6 7 8 9
    assert c.tokens.tolist() == [50, 6]
    assert c.num_occurrences == 1


def test_incremental_extend_equals_bulk_and_chains_match_reference() -> None:
    rng = np.random.default_rng(1)
    seq = rng.integers(0, 5, 3000).astype(np.int32)
    bulk = ContextIndex(seq)
    inc = ContextIndex()
    for i in range(0, len(seq), 7):
        inc.extend(seq[i:i + 7])
    ref = ref_prev_chains(seq.tolist(), bulk.max_ngram)
    np.testing.assert_array_equal(bulk._prev[:, :len(seq)], ref)
    np.testing.assert_array_equal(inc._prev[:, :len(seq)], ref)
    cfg = LookupConfig()
    _same(bulk.lookup(seq[-20:], cfg), inc.lookup(seq[-20:], cfg))


@settings(max_examples=500, deadline=None)
@given(token_lists(max_size=60), st.data(), st.integers(1, 5))
def test_lookup_matches_reference(toks: list[int], data: st.DataObject, max_ngram: int) -> None:
    cfg = data.draw(configs())
    s = ContextIndex(toks, max_ngram=max_ngram)
    tail = toks if data.draw(st.booleans()) else data.draw(tails([toks]))
    _same(s.lookup(np.array(tail, np.int32), cfg), ref_lookup_context(toks, tail, cfg, max_ngram))


def test_tree_invariants_on_random_text() -> None:
    rng = np.random.default_rng(2)
    seq = rng.integers(0, 3, 2000)
    s = ContextIndex(seq)
    cfg = LookupConfig(width=2, max_nodes=30, max_depth=6, max_occurrences=40)
    c = s.lookup(seq[-10:].astype(np.int32), cfg)
    assert 0 < len(c) <= 30
    seen = set()
    for i in range(len(c)):
        p = c.parents[i]
        assert p < i
        assert c.depth[i] == (1 if p < 0 else c.depth[p] + 1)
        if p >= 0:
            assert c.counts[i] <= c.counts[p]
        assert (p, c.tokens[i]) not in seen
        seen.add((p, c.tokens[i]))
    kids = np.bincount(c.parents + 1)
    assert kids.max() <= cfg.width


def test_rejects_bad_tokens() -> None:
    with pytest.raises(ValueError):
        ContextIndex([1, -2])
    with pytest.raises(ValueError):
        ContextIndex(np.zeros((2, 2), np.int32))
    with pytest.raises(ValueError):
        ContextIndex([0.5])
    with pytest.raises(ValueError):
        ContextIndex(max_ngram=0)


def test_large_evidence_sets_match_the_reference() -> None:
    # more than 64 occurrences: the kernel sorts them with a merge sort instead of insertion sort
    rng = np.random.default_rng(5)
    seq = rng.integers(0, 3, 600).tolist()
    cfg = LookupConfig(max_match=2, width=3, max_depth=4, max_nodes=60, max_occurrences=300)
    s = ContextIndex(seq)
    for tail in ([0], [1, 2], seq[-5:]):
        _same(s.lookup(np.array(tail, np.int32), cfg), ref_lookup_context(seq, tail, cfg, s.max_ngram))
