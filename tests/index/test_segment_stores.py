"""CorpusIndex / OutputIndex: lookups against the plain reference, documents, deletion, eviction."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import configs, tails, token_lists

from lookupspec.index import CorpusIndex, LookupConfig, OutputIndex
from lookupspec.index.reference import ref_lookup_docs


def _same(a, b) -> None:
    assert (a.match_len, a.num_occurrences) == (b.match_len, b.num_occurrences)
    for f in ("tokens", "parents", "counts", "last_seen", "depth"):
        assert getattr(a, f).tolist() == getattr(b, f).tolist(), f


def _bases(docs: list[list[int]]) -> list[int]:
    out, b = [], 0
    for d in docs:
        out.append(b)
        b += len(d) + 1
    return out


def test_worked_example_from_the_docstring() -> None:
    store = CorpusIndex()
    store.add_document("d1", [5, 6, 7, 8])
    store.add_document("d2", [5, 6, 9])
    c = store.lookup(np.array([1, 5, 6], np.int32), LookupConfig())
    assert c.match_len == 2
    assert c.paths() == {(9,): (1, 7), (7,): (1, 2), (7, 8): (1, 3)}
    assert c.tokens.tolist() == [9, 7, 8]


def test_lookup_contract_example() -> None:
    # lookup.py: store a b c a b d a b c, tail x a b
    store = CorpusIndex()
    store.add_document("d", [0, 1, 2, 0, 1, 3, 0, 1, 2])
    c = store.lookup(np.array([9, 0, 1], np.int32), LookupConfig(max_match=3, max_depth=2))
    assert (c.match_len, c.num_occurrences) == (2, 3)
    assert c.tokens.tolist() == [2, 3, 0, 0]
    assert c.counts.tolist() == [2, 1, 1, 1]
    assert c.last_seen.tolist() == [8, 5, 6, 3]  # d a (recent) is queued before c a
    assert c.parents.tolist() == [-1, -1, 1, 0]


def test_matches_never_cross_document_boundaries() -> None:
    store = CorpusIndex()
    store.add_documents([("a", [1, 2, 3]), ("b", [4, 5, 6])])
    assert store.lookup(np.array([3, 4], np.int32), LookupConfig()).match_len == 1  # "4", not "3 4"
    assert store.lookup(np.array([3], np.int32), LookupConfig()).match_len == 0  # 3 ends document a
    c = store.lookup(np.array([2], np.int32), LookupConfig(max_depth=5))
    assert c.tokens.tolist() == [3]  # stops at the end of a


def test_add_delete_replace_and_counts() -> None:
    store = CorpusIndex()
    store.add_document("a", [1, 2, 3])
    store.add_document("b", [1, 2, 4, 4])
    assert (len(store), store.num_documents) == (7, 2)
    assert store.lookup(np.array([1, 2], np.int32), LookupConfig()).num_occurrences == 2
    assert store.delete_document("a")
    assert not store.delete_document("a")
    assert (len(store), store.num_documents, "a" in store) == (4, 1, False)
    c = store.lookup(np.array([1, 2], np.int32), LookupConfig())
    assert c.tokens.tolist()[:1] == [4]
    store.add_document("b", [1, 2, 5])  # replaces b
    c = store.lookup(np.array([1, 2], np.int32), LookupConfig(max_depth=1))
    assert c.tokens.tolist() == [5]
    assert (len(store), store.num_documents) == (3, 1)
    store.delete_document("b")
    assert len(store) == 0
    assert store.lookup(np.array([1, 2], np.int32), LookupConfig()).match_len == 0
    assert store.segments == ()


def test_segments_merge_geometrically() -> None:
    store = CorpusIndex()
    for i in range(64):
        store.add_document(str(i), [i % 5, 1, 2, 3])
    assert len(store.segments) <= 4
    assert store.num_documents == 64
    store.compact()
    assert len(store.segments) == 1
    assert store.lookup(np.array([1, 2], np.int32), LookupConfig(max_occurrences=64)).num_occurrences == 64


def test_memory_is_under_sixteen_bytes_per_token() -> None:
    rng = np.random.default_rng(0)
    store = CorpusIndex()
    store.add_documents((str(i), rng.integers(0, 49152, 1000)) for i in range(200))
    assert store.memory_bytes() / len(store) <= 16


@settings(max_examples=300, deadline=None)
@given(st.lists(token_lists(max_size=25), min_size=1, max_size=5), st.data())
def test_lookup_matches_reference_across_segments_and_deletions(docs: list[list[int]],
                                                                  data: st.DataObject) -> None:
    cfg = data.draw(configs(max_occurrences=256))  # no sampling: counts must be exact everywhere
    store = CorpusIndex(auto_merge=data.draw(st.booleans()))
    for i, d in enumerate(docs):  # one segment per document (or merged), positions as in _bases
        store.add_document(str(i), d)
    dead = data.draw(st.sets(st.integers(0, len(docs) - 1), max_size=len(docs) - 1))
    for i in dead:
        store.delete_document(str(i))
    live = [d if i not in dead else [] for i, d in enumerate(docs)]
    tail = data.draw(tails(docs))
    _same(store.lookup(np.array(tail, np.int32), cfg), ref_lookup_docs(live, _bases(docs), tail, cfg))


@settings(max_examples=80, deadline=None)
@given(st.lists(token_lists(min_size=5, max_size=60), min_size=1, max_size=4), st.data())
def test_large_evidence_is_sampled_in_suffix_array_order(docs: list[list[int]], data: st.DataObject) -> None:
    # Few occurrences allowed: the evidence is the midpoints of equal strata in suffix-array order,
    # segment by segment; the whole tree (wide enough to hold everything) has the reference's counts.
    store = CorpusIndex(auto_merge=False)  # one segment per document
    for i, d in enumerate(docs):
        store.add_document(str(i), d)
    k = data.draw(st.integers(1, 5))
    cfg = LookupConfig(max_match=data.draw(st.integers(1, 3)), width=64, max_depth=3, max_nodes=4096,
                       max_occurrences=k)
    tail = data.draw(tails(docs))
    got = store.lookup(np.array(tail, np.int32), cfg)
    want = ref_lookup_docs(docs, _bases(docs), tail, cfg, segments=[[i] for i in range(len(docs))])
    assert (got.match_len, got.num_occurrences) == (want.match_len, want.num_occurrences)
    assert {p: c for p, (c, _) in got.paths().items()} == {p: c for p, (c, _) in want.paths().items()}


def test_lookups_are_safe_while_another_thread_adds_and_deletes() -> None:
    store = CorpusIndex()
    rng = np.random.default_rng(0)
    store.add_document("seed", [1, 2, 3, 4, 5])
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(150):
                store.add_document(f"d{i}", rng.integers(0, 6, 50))
                if i % 3 == 0:
                    store.delete_document(f"d{i // 2}")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            stop.set()

    t = threading.Thread(target=writer)
    t.start()
    cfg = LookupConfig()
    tail = np.array([1, 2, 3], np.int32)
    n = 0
    while not stop.is_set() or n == 0:
        c = store.lookup(tail, cfg)
        assert c.match_len >= 1
        n += 1
    t.join()
    assert not errors


def test_output_store_evicts_oldest_first() -> None:
    store = OutputIndex(cap_tokens=10, evict_to=0.5)
    store.append([1, 2, 3, 4])
    store.append([1, 2, 3, 5])
    assert len(store) == 8
    store.append([1, 2, 3, 6])
    assert (len(store), store.num_outputs) == (4, 1)
    c = store.lookup(np.array([2, 3], np.int32), LookupConfig())
    assert c.tokens.tolist() == [6]


def test_output_store_stays_under_its_cap() -> None:
    rng = np.random.default_rng(0)
    store = OutputIndex(cap_tokens=1000)
    for _ in range(300):
        store.append(rng.integers(0, 50, rng.integers(1, 60)))
        assert len(store) <= 1000
    assert len(store) >= 800
    store.append(np.arange(5000))  # longer than the cap: its tail is kept
    assert len(store) == 1000


def test_output_store_matches_reference_on_live_outputs() -> None:
    rng = np.random.default_rng(3)
    store = OutputIndex(cap_tokens=200, evict_to=0.6)
    outs = [rng.integers(0, 4, rng.integers(1, 30)).tolist() for _ in range(40)]
    for o in outs:
        store.append(o)
    bases = _bases(outs)
    live = [d.tolist() for s in store.segments for d in (x[1] for x in s.live_docs())]
    n_live = len(live)
    docs = [[] for _ in outs[:-n_live]] + outs[-n_live:]
    assert live == outs[-n_live:] or sorted(map(tuple, live)) == sorted(map(tuple, outs[-n_live:]))
    cfg = LookupConfig(max_occurrences=1000)
    for tail in ([0, 1], [3], [2, 2, 1], outs[-1][-3:]):
        _same(store.lookup(np.array(tail, np.int32), cfg), ref_lookup_docs(docs, bases, tail, cfg))


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        OutputIndex(0)
    with pytest.raises(TypeError):
        CorpusIndex().add_document(3, [1])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        CorpusIndex().add_document("a", [-1])
