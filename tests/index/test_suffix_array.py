"""build_sa / sa_range / range_max / validate_sa against their plain references."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import token_lists

from lookupspec.index.lookup import SEP
from lookupspec.index.reference import ref_sa_range, ref_suffix_key, ref_suffix_keys
from lookupspec.index.segments import build_segment
from lookupspec.index.suffix_array import build_sa, sa_range, validate_sa


def _text(docs: list[list[int]]) -> np.ndarray:
    out: list[int] = []
    for d in docs:
        out += [*d, SEP]
    return np.array(out, np.int32)


def _keys(text: np.ndarray, sa: np.ndarray) -> list[tuple[int, ...]]:
    t = text.tolist()
    return [ref_suffix_key(t, s) for s in sa]


def test_worked_example_from_the_docstring() -> None:
    text = np.array([2, 1, 2, SEP], np.int32)  # b a b $
    sa = build_sa(text)
    assert sa.tolist() == [1, 2, 0]
    assert sa_range(text, 0, len(text), sa, 0, len(sa), np.array([2], np.int32), 0, 1) == (1, 3)


@settings(max_examples=150, deadline=None)
@given(st.lists(token_lists(max_size=40), min_size=1, max_size=4))
def test_suffix_array_sorts_like_the_reference(docs: list[list[int]]) -> None:
    text = _text(docs)
    sa = build_sa(text)
    assert _keys(text, sa) == ref_suffix_keys(text.tolist())
    assert sorted(sa.tolist()) == [i for i in range(len(text)) if text[i] != SEP]
    assert validate_sa(text, sa, text >= 0) == 0


def test_long_repeats_are_sorted_to_key_depth() -> None:
    text = _text([[3] * 200, [3] * 150 + [1], list(range(5)) * 40])
    sa = build_sa(text)
    assert _keys(text, sa) == ref_suffix_keys(text.tolist())


def test_huge_token_ids_are_remapped_and_sorted() -> None:
    docs = [[2**31 - 2, 5, 2**31 - 2, 7], [5, 2**30]]
    seg = build_segment([("a", np.array(docs[0], np.int32), 0), ("b", np.array(docs[1], np.int32), 5)])
    assert _keys(seg.text, seg.sa) == ref_suffix_keys(seg.text.tolist())


@settings(max_examples=150, deadline=None)
@given(token_lists(max_size=50), st.lists(st.integers(0, 7), min_size=1, max_size=5))
def test_range_of_a_pattern_matches_the_reference(doc: list[int], pattern: list[int]) -> None:
    text = _text([doc])
    sa = build_sa(text)
    pat = np.array(pattern, np.int32)
    got = sa_range(text, 0, len(text), sa, 0, len(sa), pat, 0, len(pattern))
    assert got == ref_sa_range(text.tolist(), sa.tolist(), pattern)


def test_validate_rejects_unsorted_duplicate_and_out_of_range_arrays() -> None:
    text = _text([[1, 2, 3, 1, 2]])
    sa = build_sa(text)
    live = text >= 0
    assert validate_sa(text, sa, live) == 0
    swapped = sa.copy()
    swapped[[0, -1]] = swapped[[-1, 0]]
    assert validate_sa(text, swapped, live) != 0
    dup = sa.copy()
    dup[1] = dup[0]
    assert validate_sa(text, dup, live) != 0
    big = sa.copy()
    big[0] = 10**6
    assert validate_sa(text, big, live) != 0
    neg = sa.copy()
    neg[0] = -5
    assert validate_sa(text, neg, live) != 0
    assert validate_sa(text, sa[:-1], live) != 0
    assert validate_sa(text[:-1], sa, live[:-1]) != 0  # no final separator
