"""The behaviour both backends share: every test runs against the embedded log and against Redis."""

from __future__ import annotations

import numpy as np
import pytest

from lookupspec.store import AddDocument, AppendOutput, CollectionInfo, StoreClosedError


def toks(*ids: int) -> np.ndarray:
    return np.array(ids, dtype=np.int32)


class Recorder:
    """An index owner that mirrors the state through the listener hooks."""

    def __init__(self) -> None:
        self.docs: dict[tuple[str, str, str], list[int]] = {}
        self.outputs: dict[str, list[list[int]]] = {}
        self.events: list[tuple] = []

    def on_document_added(self, ns, coll, doc_id, tokens):
        assert tokens.dtype == np.int32 and tokens.ndim == 1
        self.events.append(("added", ns, coll, doc_id))
        self.docs[(ns, coll, doc_id)] = tokens.tolist()

    def on_document_deleted(self, ns, coll, doc_id):
        self.events.append(("deleted", ns, coll, doc_id))
        del self.docs[(ns, coll, doc_id)]

    def on_collection_deleted(self, ns, coll):
        self.events.append(("collection_deleted", ns, coll))
        self.docs = {k: v for k, v in self.docs.items() if k[:2] != (ns, coll)}

    def on_output_appended(self, ns, tokens):
        self.outputs.setdefault(ns, []).append(tokens.tolist())


def write_sample(store) -> None:
    store.add_document("acme", "manuals", "m1", "first manual", toks(1, 2, 3), {"lang": "en", "v": [1, 2]})
    store.add_document("acme", "manuals", "m2", "second manual", toks(4, 5))
    store.add_document("acme", "code", "c1", "def f(): pass", toks(9, 9, 9, 9))
    store.append_output("acme", toks(1, 2, 3, 4))
    store.append_output("acme", toks(5))


def test_append_then_replay_round_trip(open_backend):
    store = open_backend()
    write_sample(store)
    digest = store.state.digest()
    assert store.state.list_collections("acme") == [
        CollectionInfo("code", 1, 4), CollectionInfo("manuals", 2, 5)]
    store.close()

    restarted = open_backend()
    recorder = Recorder()
    restarted.subscribe(recorder)
    state = restarted.state
    assert state.digest() == digest
    assert state.get_collection("acme", "manuals") == CollectionInfo("manuals", 2, 5)
    doc = state.get_document("acme", "manuals", "m1")
    assert doc is not None
    assert (doc.text, dict(doc.metadata), doc.token_count) == ("first manual", {"lang": "en", "v": [1, 2]}, 3)
    assert state.document_tokens("acme", "manuals", "m1").tolist() == [1, 2, 3]
    assert [t.tolist() for t in state.outputs("acme")] == [[1, 2, 3, 4], [5]]
    assert recorder.docs == {("acme", "manuals", "m1"): [1, 2, 3], ("acme", "manuals", "m2"): [4, 5],
                             ("acme", "code", "c1"): [9, 9, 9, 9]}
    assert recorder.outputs == {"acme": [[1, 2, 3, 4], [5]]}
    assert restarted.health()["state"] == "ok"


def test_a_record_appended_twice_has_one_effect_live_and_on_replay(open_backend):
    store = open_backend()
    output = AppendOutput("acme", toks(7, 8))
    doc = AddDocument("acme", "c", "d", "text", toks(1))
    for record in (output, output, doc, doc):  # a client retrying its write
        store.append(record)
    assert store.state.apply(output) is False
    assert len(store.state.outputs("acme")) == 1
    assert store.state.get_collection("acme", "c") == CollectionInfo("c", 1, 1)
    digest = store.state.digest()
    store.close()

    restarted = open_backend()
    assert restarted.state.digest() == digest
    assert len(restarted.state.outputs("acme")) == 1
    assert restarted.health()["duplicates_skipped"] >= 2


def test_namespaces_never_see_each_other(open_backend):
    store = open_backend()
    store.add_document("alpha", "shared-name", "d", "alpha secret", toks(1, 1))
    store.add_document("beta", "shared-name", "d", "beta secret", toks(2, 2, 2))
    store.append_output("alpha", toks(11))
    store.delete_collection("beta", "shared-name")
    store.close()

    state = open_backend().state
    assert state.list_collections("alpha") == [CollectionInfo("shared-name", 1, 2)]
    assert state.get_document("alpha", "shared-name", "d").text == "alpha secret"
    assert state.list_collections("beta") == []
    assert not state.has_document("beta", "shared-name", "d")
    assert [t.tolist() for t in state.outputs("alpha")] == [[11]]
    assert state.outputs("beta") == []
    assert state.list_collections("gamma") == [] and state.get_collection("gamma", "shared-name") is None
    assert state.namespaces() == ["alpha"]


def test_delete_semantics_survive_restart(open_backend):
    store = open_backend()
    recorder = Recorder()
    store.subscribe(recorder)
    write_sample(store)
    store.delete_document("acme", "manuals", "m1")
    assert not store.state.has_document("acme", "manuals", "m1")
    assert store.state.get_collection("acme", "manuals") == CollectionInfo("manuals", 1, 2)

    store.add_document("acme", "manuals", "m2", "second manual v2", toks(6, 6, 6))  # replace
    assert store.state.get_collection("acme", "manuals") == CollectionInfo("manuals", 1, 3)
    assert recorder.events[-2:] == [("deleted", "acme", "manuals", "m2"), ("added", "acme", "manuals", "m2")]

    store.delete_collection("acme", "code")
    assert store.state.get_collection("acme", "code") is None
    assert recorder.events[-1] == ("collection_deleted", "acme", "code")
    store.add_document("acme", "code", "c2", "new", toks(3))  # a deleted collection can be re-created
    store.delete_document("acme", "manuals", "m2")  # deleting the last document keeps the collection
    store.delete_document("acme", "manuals", "never-existed")

    expected = [CollectionInfo("code", 1, 1), CollectionInfo("manuals", 0, 0)]
    assert store.state.list_collections("acme") == expected
    assert recorder.docs == {("acme", "code", "c2"): [3]}
    digest = store.state.digest()
    store.close()

    restarted = open_backend()
    replayed = Recorder()
    restarted.subscribe(replayed)
    assert restarted.state.list_collections("acme") == expected
    assert restarted.state.digest() == digest
    assert replayed.docs == recorder.docs


def test_restart_loses_nothing_acknowledged(open_backend):
    store = open_backend()
    acks = [store.add_document("ns", f"c{i % 3}", f"d{i}", f"text {i}", toks(*range(i % 17)))
            for i in range(120)]
    acks += [store.append_output("ns", toks(i, i + 1)) for i in range(30)]
    assert all(ack.offset is not None and not ack.buffered for ack in acks)
    assert len({ack.record_id for ack in acks}) == len(acks)
    store.close()
    with pytest.raises(StoreClosedError):
        store.add_document("ns", "c0", "late", "after close", toks(1))

    batch = [AddDocument("ns", "batch", f"b{i}", f"batch doc {i}", toks(i, i)) for i in range(40)]
    reopened = open_backend()
    batch_acks = reopened.append_many(batch)  # one fsync / one pipelined round trip
    assert [a.record_id for a in batch_acks] == [r.record_id for r in batch]
    assert len({a.offset for a in batch_acks}) == 40
    reopened.close()

    state = open_backend().state
    assert state.get_collection("ns", "batch") == CollectionInfo("batch", 40, 80)
    assert all(state.has_document("ns", f"c{i % 3}", f"d{i}") for i in range(120))
    assert sorted(t.tolist() for t in state.outputs("ns")) == sorted([i, i + 1] for i in range(30))
    assert state.stats()["documents"] == 160
