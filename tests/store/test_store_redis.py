"""Redis backend: replicas sharing one stream, outages, overflow, caps. Real redis-server processes."""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest

from lookupspec.store import AddDocument, BufferFullError, RedisConfig, RedisLog, Store, open_store

pytestmark = pytest.mark.redis


def toks(*ids: int) -> np.ndarray:
    return np.array(ids, dtype=np.int32)


@pytest.fixture
def replicas(store_closer, redis_config):
    """``replicas(server, prefix, **overrides)`` opens one more started replica on that server."""

    def open_replica(server, prefix, **overrides) -> Store:
        store = store_closer(Store(RedisLog(redis_config(server.url, prefix, **overrides))))
        store.start()
        return store

    return open_replica


def test_a_write_on_one_replica_is_applied_on_the_other_within_a_second(redis_server, replicas, wait_until):
    prefix = f"test:{uuid.uuid4().hex[:12]}:"
    a, b = replicas(redis_server, prefix), replicas(redis_server, prefix)
    a.add_document("ns", "docs", "d1", "shared text", toks(1, 2, 3), {"source": "a"})
    t0 = time.monotonic()
    assert wait_until(lambda: b.state.has_document("ns", "docs", "d1"), timeout=1.0)
    assert time.monotonic() - t0 < 1.0
    b.append_output("ns", toks(4, 5))
    a.delete_document("ns", "docs", "d1")
    assert wait_until(lambda: not b.state.has_document("ns", "docs", "d1") and a.state.outputs("ns"), 1.0)
    assert wait_until(lambda: a.state.digest() == b.state.digest(), 1.0)
    # each replica applied its own records exactly once, although it also reads them back
    assert wait_until(lambda: a.health()["duplicates_skipped"] >= 2, 1.0)
    assert len(a.state.outputs("ns")) == 1

    for i in range(130):  # more than one replay page (page_size 50)
        a.add_document("ns", "bulk", f"b{i}", f"text {i}", toks(i))
    b.close()
    b2 = replicas(redis_server, prefix)
    assert b2.health()["caught_up"] and b2.health()["state"] == "ok"
    assert wait_until(lambda: b2.state.digest() == a.state.digest(), 1.0)
    assert b2.state.get_collection("ns", "bulk").document_count == 130


def test_open_store_uses_redis_and_its_key_prefix(redis_server, tmp_path):
    prefix = f"test:{uuid.uuid4().hex[:12]}:"
    options = {"key_prefix": prefix, "stream_maxlen": 50, "buffer_limit": 10}
    with open_store(tmp_path, redis_server.url, **options) as store:
        store.add_document("ns", "c", "d", "t", toks(1))
        for i in range(400):
            store.append_output("ns", toks(i))
        health = store.health()
        assert health["backend"] == "redis" and health["buffer_limit"] == 10
        with redis_server.client() as raw:
            keys = {k.decode() for k in raw.scan_iter(match=f"{prefix}*")}
            assert keys == set(health["streams"]) and all(k.startswith(prefix) for k in keys)
            # outputs are a cache: capped (approximately, whole stream nodes at a time) ...
            assert raw.xlen(f"{prefix}{{log}}:outputs") < 400
            # ... documents are never trimmed by default
            assert raw.xlen(f"{prefix}{{log}}:documents") == 1
        assert len(store.state.outputs("ns")) == 400  # trimming never removes applied state


def test_corrupt_stream_entry_is_skipped_and_reported(redis_server, replicas, wait_until):
    prefix = f"test:{uuid.uuid4().hex[:12]}:"
    store = replicas(redis_server, prefix)
    with redis_server.client() as raw:
        raw.xadd(f"{prefix}{{log}}:documents", {b"r": b"\x01garbage"})
    store.add_document("ns", "c", "after", "t", toks(1))
    other = replicas(redis_server, prefix)
    assert other.state.has_document("ns", "c", "after")
    assert wait_until(lambda: store.health()["corrupt_records"] == 1, 1.0)
    assert other.health()["corrupt_records"] == 1 and "skipped" in other.health()["last_error"]


def test_redis_outage_loses_nothing_and_replicas_converge(own_redis_server, replicas, wait_until):
    server = own_redis_server
    prefix = "test:outage:"
    stores = [replicas(server, prefix, buffer_limit=1000), replicas(server, prefix, buffer_limit=1000)]
    per_replica, outage_after = 150, 40
    acked: list[list[tuple[str, str, str]]] = [[], []]
    failures: list[BaseException] = []
    started_outage = threading.Barrier(3)
    outage_latencies: list[float] = []

    def load(r: int) -> None:
        store = stores[r]
        for i in range(per_replica):
            if i == outage_after:
                started_outage.wait()
            t0 = time.monotonic()
            try:
                if i % 5 == 4:
                    store.append_output("ns", toks(r, i))
                else:
                    store.add_document("ns", f"c{i % 3}", f"r{r}-{i}", f"text {r} {i}", toks(r, i, i))
                    acked[r].append(("ns", f"c{i % 3}", f"r{r}-{i}"))
                    if i % 10 == 3:  # some deletes too
                        store.delete_document("ns", f"c{(i - 3) % 3}", f"r{r}-{i - 3}")
                        acked[r].remove(("ns", f"c{(i - 3) % 3}", f"r{r}-{i - 3}"))
            except BaseException as exc:
                failures.append(exc)
            if i >= outage_after:
                outage_latencies.append(time.monotonic() - t0)
            time.sleep(0.004)

    threads = [threading.Thread(target=load, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    started_outage.wait()
    server.stop()
    assert wait_until(lambda: all(s.health()["state"] == "degraded" for s in stores), 3.0)
    assert wait_until(lambda: all(s.health()["buffered"] > 10 for s in stores), 3.0)
    server.start()
    for t in threads:
        t.join()

    assert failures == []
    assert wait_until(lambda: all(s.health()["state"] == "ok" for s in stores), 10.0), \
        [s.health() for s in stores]
    assert wait_until(lambda: stores[0].state.digest() == stores[1].state.digest(), 5.0)
    for store in stores:
        health = store.health()
        assert health["buffered"] == 0 and health["overflow"] == 0 and health["flushed"] > 10
        assert all(store.state.has_document(*key) for key in acked[0] + acked[1])
        assert health["documents"] == len(acked[0]) + len(acked[1])
        assert len(store.state.outputs("ns")) == 2 * (per_replica // 5)
    # appends during the outage went to the buffer without waiting on the network (the first one
    # to meet the dead Redis waits at most socket_timeout = 0.25 s; the margin is for a busy CI box)
    assert max(outage_latencies) < 1.0

    late = replicas(server, prefix)  # a replica started after the outage replays the same state
    assert late.state.digest() == stores[0].state.digest()


def test_buffer_overflow_rejects_the_newest_and_is_counted(own_redis_server, replicas, wait_until):
    server = own_redis_server
    a = replicas(server, "test:overflow:", buffer_limit=5)
    a.add_document("ns", "c", "before", "t", toks(1))
    server.stop()
    results = []
    for i in range(8):
        try:
            results.append(a.add_document("ns", "c", f"d{i}", "t", toks(i)).buffered)
        except BufferFullError:
            results.append("rejected")
    assert results == [True] * 5 + ["rejected"] * 3
    with pytest.raises(BufferFullError):  # a batch is all or nothing
        a.append_many([AddDocument("ns", "c", f"batch{i}", "t", toks(i)) for i in range(2)])
    health = a.health()
    assert (health["state"], health["buffered"], health["overflow"]) == ("degraded", 5, 5)
    assert a.state.get_collection("ns", "c").document_count == 6  # rejected records were not applied

    server.start()
    assert wait_until(lambda: a.health()["state"] == "ok", 10.0), a.health()
    b = replicas(server, "test:overflow:")
    doc_ids = sorted(d.doc_id for d in b.state.list_documents("ns", "c"))
    assert doc_ids == ["before"] + [f"d{i}" for i in range(5)]


def test_a_replica_started_while_redis_is_down_serves_and_catches_up(own_redis_server, replicas, wait_until):
    server = own_redis_server
    a = replicas(server, "test:late:")
    a.add_document("ns", "c", "early", "t", toks(1))
    server.stop()
    t0 = time.monotonic()
    b = replicas(server, "test:late:")  # start-up does not hang on a dead Redis
    b.add_document("ns", "c", "from-b", "t", toks(2))
    assert time.monotonic() - t0 < 2.0
    assert b.health()["state"] == "degraded" and not b.health()["caught_up"]
    assert not b.health()["synced"] and a.health()["synced"]  # b has not read the shared log yet
    assert b.state.has_document("ns", "c", "from-b")  # its own append is served at once
    server.start()
    assert wait_until(lambda: b.health()["synced"], 10.0)
    assert wait_until(lambda: b.state.has_document("ns", "c", "early"), 10.0)
    assert wait_until(lambda: a.state.has_document("ns", "c", "from-b"), 10.0)
    assert wait_until(lambda: b.health()["state"] == "ok" and b.health()["lag_s"] == 0.0, 5.0)


def test_outputs_have_their_own_buffer_so_they_never_starve_document_writes(own_redis_server, replicas,
                                                                             wait_until):
    server = own_redis_server
    a = replicas(server, "test:budgets:", buffer_limit=3, output_buffer_limit=4)
    server.stop()
    outputs = []
    for i in range(10):  # a busy replica generates while Redis is down: its outputs fill their buffer
        try:
            outputs.append(a.append_output("ns", toks(i, i + 1)).buffered)
        except BufferFullError:
            outputs.append("dropped")
    assert outputs == [True] * 4 + ["dropped"] * 6
    docs = [a.add_document("ns", "c", f"d{i}", "t", toks(i)).buffered for i in range(3)]
    assert docs == [True] * 3  # documents still have their whole budget
    with pytest.raises(BufferFullError, match="document"):
        a.add_document("ns", "c", "d3", "t", toks(3))
    health = a.health()
    assert (health["buffered_documents"], health["buffered_outputs"], health["buffered"]) == (3, 4, 7)
    server.start()
    assert wait_until(lambda: a.health()["state"] == "ok", 10.0), a.health()
    b = replicas(server, "test:budgets:")
    assert sorted(d.doc_id for d in b.state.list_documents("ns", "c")) == ["d0", "d1", "d2"]
    assert len(b.state.outputs("ns")) == 4


def test_a_graceful_stop_spills_buffered_writes_and_the_next_start_writes_them(own_redis_server, replicas,
                                                                               wait_until, tmp_path):
    server = own_redis_server
    spill = tmp_path / "spill"
    a = replicas(server, "test:spill:", spill_dir=spill)
    server.stop()
    assert a.add_document("ns", "c", "kept", "acknowledged while redis was down", toks(1, 2)).buffered
    assert a.append_output("ns", toks(3, 4)).buffered
    a.close()  # a planned stop before Redis returns: nothing acknowledged may be lost
    files = list(spill.glob("spill-*.frames"))
    assert len(files) == 1 and a.log.health()["spilled"] == 2

    # A spill file another live replica holds is not taken over twice.
    import fcntl
    import os

    fd = os.open(files[0], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    server.start()
    other = replicas(server, "test:spill:", spill_dir=spill)
    assert not other.state.has_document("ns", "c", "kept") and other.log.health()["recovered_from_spill"] == 0
    os.close(fd)

    b = replicas(server, "test:spill:", spill_dir=spill)  # a restart on the same data directory
    assert b.state.has_document("ns", "c", "kept")  # applied at start-up, before Redis has it
    assert b.log.health()["recovered_from_spill"] == 2
    assert wait_until(lambda: not list(spill.glob("spill-*.frames")), 10.0)  # deleted once written
    c = replicas(server, "test:spill:")  # a replica without that directory gets it from Redis
    assert c.state.get_document("ns", "c", "kept").text == "acknowledged while redis was down"
    assert [list(o) for o in c.state.outputs("ns")] == [[3, 4]]
    assert wait_until(lambda: other.state.has_document("ns", "c", "kept"), 10.0)
    b.close()
    assert not list(spill.glob("spill-*")), "nothing left behind once Redis has everything"


def test_config_validation():
    with pytest.raises(ValueError, match="redis url"):
        RedisConfig("http://localhost")
    with pytest.raises(ValueError, match="stream_maxlen"):
        RedisConfig("redis://127.0.0.1:1", stream_maxlen=0)
    with pytest.raises(ValueError, match="backoff"):
        RedisConfig("redis://127.0.0.1:1", backoff_initial=5, backoff_max=1)
