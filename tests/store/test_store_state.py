"""StoreState: order-independent, idempotent apply; listeners mirror the state exactly."""

from __future__ import annotations

import threading

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lookupspec.store import (
    AddDocument,
    AppendOutput,
    DeleteCollection,
    DeleteDocument,
    StoreState,
)


class Mirror:
    """A listener that rebuilds documents and outputs from hook events alone."""

    def __init__(self) -> None:
        self.docs: dict[tuple[str, str, str], bytes] = {}
        self.outputs: list[tuple[str, bytes]] = []

    def on_document_added(self, ns, coll, doc_id, tokens):
        assert (ns, coll, doc_id) not in self.docs, "a replacement must be announced by a delete first"
        self.docs[(ns, coll, doc_id)] = tokens.tobytes()

    def on_document_deleted(self, ns, coll, doc_id):
        del self.docs[(ns, coll, doc_id)]

    def on_collection_deleted(self, ns, coll):
        self.docs = {k: v for k, v in self.docs.items() if k[:2] != (ns, coll)}

    def on_output_appended(self, ns, tokens):
        self.outputs.append((ns, tokens.tobytes()))

    def on_output_evicted(self, ns, tokens):
        self.outputs.remove((ns, tokens.tobytes()))


def state_docs(state: StoreState) -> dict[tuple[str, str, str], bytes]:
    docs = {}
    for ns in ("a", "b"):
        for info in state.list_collections(ns):
            for doc in state.list_documents(ns, info.name):
                docs[(ns, info.name, doc.doc_id)] = state.document_tokens(ns, info.name, doc.doc_id).tobytes()
    return docs


@st.composite
def record_logs(draw):
    """Records with explicit, often out-of-order stamps, as concurrent replicas produce them."""
    op = st.tuples(st.sampled_from("AADCO"), st.sampled_from("ab"), st.sampled_from(["c1", "c2"]),
                   st.sampled_from(["d1", "d2", "d3"]), st.integers(0, 40), st.integers(0, 5))
    ops = draw(st.lists(op, max_size=30))
    records = []
    for i, (kind, ns, coll, doc, stamp, n) in enumerate(ops):
        common = {"record_id": f"{i:032x}", "stamp": stamp}
        tokens = np.arange(i, i + n, dtype=np.int32)
        if kind == "A":
            records.append(AddDocument(ns, coll, doc, f"text {i}", tokens, {"i": i}, **common))
        elif kind == "D":
            records.append(DeleteDocument(ns, coll, doc, **common))
        elif kind == "C":
            records.append(DeleteCollection(ns, coll, **common))
        else:
            records.append(AppendOutput(ns, tokens, **common))
    return records, draw(st.permutations(records))


@settings(max_examples=300, deadline=None)
@given(record_logs(), st.sampled_from([None, 2]))
def test_replicas_applying_records_in_any_order_converge(logs, output_limit):
    in_order, shuffled = logs
    states, mirrors = [], []
    for records in (in_order, shuffled, shuffled + in_order):  # the last one also re-applies everything
        state, mirror = StoreState(max_outputs_per_namespace=output_limit), Mirror()
        state.subscribe(mirror)
        for record in records:
            state.apply(record)
        states.append(state)
        mirrors.append(mirror)
    assert len({s.digest() for s in states}) == 1
    assert len({tuple(s.list_collections("a") + s.list_collections("b")) for s in states}) == 1
    for state, mirror in zip(states, mirrors, strict=True):
        assert mirror.docs == state_docs(state)
        assert sorted(mirror.outputs) == sorted(
            (ns, t.tobytes()) for ns in ("a", "b") for t in state.outputs(ns))
    if output_limit is not None:
        assert all(len(s.outputs(ns)) <= output_limit for s in states for ns in "ab")
    # A late subscriber gets exactly the current content.
    late = Mirror()
    states[1].subscribe(late)
    assert late.docs == mirrors[1].docs


def test_last_writer_wins_worked_example():
    add = AddDocument("ns", "c", "d1", "t", np.array([1], np.int32), stamp=5, record_id="a" * 32)
    delete = DeleteCollection("ns", "c", stamp=7, record_id="b" * 32)
    for order in ((add, delete), (delete, add)):
        state = StoreState()
        for record in order:
            state.apply(record)
        assert state.list_collections("ns") == [] and not state.has_document("ns", "c", "d1")
    newer = AddDocument("ns", "c", "d1", "t", np.array([1], np.int32), stamp=9, record_id="c" * 32)
    for order in ((newer, delete), (delete, newer)):
        state = StoreState()
        for record in order:
            state.apply(record)
        assert state.has_document("ns", "c", "d1")


def test_a_broken_listener_is_counted_and_does_not_stop_apply():
    class Broken:
        def on_output_appended(self, ns, tokens):
            raise RuntimeError("index bug")

    state = StoreState()
    state.subscribe(Broken())
    assert state.apply(AppendOutput("ns", np.array([1], np.int32)))
    assert state.stats()["listener_errors"] == 1 and len(state.outputs("ns")) == 1


def test_concurrent_applies_and_reads_are_consistent():
    state = StoreState()
    mirror = Mirror()
    state.subscribe(mirror)

    def writer(w: int) -> None:
        for i in range(300):
            state.apply(AddDocument("a", "c1", f"w{w}-{i % 20}", "t", np.array([w, i], np.int32)))
            if i % 7 == 0:
                state.apply(DeleteDocument("a", "c1", f"w{w}-{(i + 3) % 20}"))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        info = state.get_collection("a", "c1")
        assert info is None or info.token_count == 2 * info.document_count
    for t in threads:
        t.join()
    assert mirror.docs == state_docs(state)


def test_output_cache_keeps_the_newest_and_forgets_evicted_ids():
    state = StoreState(max_outputs_per_namespace=3)
    records = [AppendOutput("ns", np.array([i], np.int32), stamp=100 + i) for i in range(6)]
    for record in records:
        state.apply(record)
    assert [int(t[0]) for t in state.outputs("ns")] == [3, 4, 5]
    assert state.apply(records[0]) is True and [int(t[0]) for t in state.outputs("ns")] == [3, 4, 5]
    assert state.stats()["outputs_evicted"] == 3 and state.stats()["output_tokens"] == 3


@settings(max_examples=300, deadline=None)
@given(record_logs(), st.sampled_from([None, 2]), st.integers(0, 30))
def test_the_live_records_alone_rebuild_the_state_and_absorb_every_later_record(logs, output_limit, cut):
    """Compaction's contract: a log's first records replaced by the state's ``live_records()`` (in
    any order), followed by the rest of the log, and any record re-delivered, give the same state."""
    in_order, shuffled = logs
    full = StoreState(max_outputs_per_namespace=output_limit)
    for record in in_order:
        full.apply(record)
    head = StoreState(max_outputs_per_namespace=output_limit)
    for record in shuffled[:cut]:
        head.apply(record)
    snapshot = head.live_records()
    assert len(snapshot) == head.live_count()
    assert len(head.live_records(outputs=False)) == head.live_count(outputs=False)
    compacted = StoreState(max_outputs_per_namespace=output_limit)
    for record in reversed(snapshot):
        compacted.apply(record)
    assert compacted.digest() == head.digest()
    assert compacted.list_collections("a") == head.list_collections("a")
    for record in shuffled[cut:] + in_order:  # the tail, then every record again (at-least-once)
        compacted.apply(record)
    assert compacted.digest() == full.digest()
    assert compacted.list_collections("a") + compacted.list_collections("b") == \
        full.list_collections("a") + full.list_collections("b")


def test_remembered_record_ids_stay_bounded_by_the_live_state_under_churn():
    state = StoreState()
    for round_ in range(50):
        for d in range(20):
            state.apply(AddDocument("ns", "c", f"d{d}", "t", np.array([round_, d], np.int32)))
        state.apply(DeleteDocument("ns", "c", "d0"))
    # 20 documents (d0 dead, its newest delete held) and nothing of the 49 earlier rounds
    assert state.live_count() <= 21 + 1
    assert state.stats()["records_applied"] == 50 * 21
