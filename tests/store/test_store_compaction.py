"""Compaction of the log (issue 53): under churn the embedded log and the Redis documents stream stay
within a constant factor of the live state, a restart replays only that, and a kill -9 at any step of
a compaction loses nothing acknowledged; replicas converge, whichever of them compacted, including a
replica that reads from a cursor the compaction trimmed away."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
from redis_harness import RedisServer

from lookupspec.store import RedisLog, Store, StoreState, open_store
from lookupspec.store.records import AddDocument, AppendOutput, DeleteDocument

DOCS = 10  # document ids the churn replaces over and over


def toks(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def churn(store: Store, rounds: int, reference: StoreState | None = None) -> None:
    """Replace DOCS documents ``rounds`` times, delete one per round, append one output per round."""
    for r in range(rounds):
        records = [AddDocument("ns", "c", f"d{d}", f"v{r}", toks(r, d), {"r": r}) for d in range(DOCS)]
        records.append(DeleteDocument("ns", "c", f"d{r % DOCS}"))
        records.append(AppendOutput("ns", toks(r, r)))
        store.append_many(records)
        if reference is not None:
            for record in records:
                reference.apply(record)


def test_the_embedded_log_stays_bounded_by_the_live_state_and_restarts_to_the_same_state(tmp_path: Path):
    reference = StoreState()
    store = open_store(tmp_path / "data", None, compact_min_records=50)
    churn(store, 60, reference)
    health = store.health()
    assert health["compactions"] >= 1
    live = store.state.live_count()
    assert health["log_records"] <= 2 * live + DOCS + 2  # at most one batch past the trigger
    assert store.state.digest() == reference.digest()
    store.close()
    assert not (tmp_path / "data" / "store.log.compact").exists()

    restarted = open_store(tmp_path / "data", None, compact_min_records=50)
    assert restarted.health()["replayed"] == health["log_records"] < 60 * (DOCS + 2)
    assert restarted.state.digest() == reference.digest()
    churn(restarted, 5, reference)  # appends go on after the compacted part
    restarted.close()
    again = open_store(tmp_path / "data", None)
    assert again.state.digest() == reference.digest()
    again.close()


CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import numpy as np
    from lookupspec.store import open_store
    from lookupspec.store import embedded as emb, redis_backend as rb

    backend, where, data_dir, url, prefix = sys.argv[1:6]

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if backend == "embedded":
        compacting = False
        real_compact, real_write, real_replace = emb.EmbeddedLog.compact, emb._write_all, os.replace

        def compact(self, live):
            global compacting
            if where == "before":
                die()
            compacting = True
            real_compact(self, live)

        def write_all(fd, data):
            if compacting and where == "snapshot":
                real_write(fd, data[: len(data) // 2])  # half the snapshot on disk, then the kill
                die()
            real_write(fd, data)

        def replace(src, dst):
            if compacting and where == "fsynced":
                die()  # the new file is complete and synced, the rename never happens
            real_replace(src, dst)
            if compacting and where == "renamed":
                die()

        emb.EmbeddedLog.compact, emb._write_all, os.replace = compact, write_all, replace
        store = open_store(Path(data_dir), None, compact_min_records=40)
    else:
        real_source = rb.RedisLog.set_snapshot_source

        def set_source(self, live_records, live_count):
            real_source(self, live_records, live_count)
            real_script = self._compact_script

            def script(keys, args):
                if where == "before":
                    die()  # the snapshot is taken, nothing of it reached Redis
                done = real_script(keys=keys, args=args)
                if where == "after":
                    die()  # snapshot stored and the stream trimmed
                return done

            self._compact_script = script

        rb.RedisLog.set_snapshot_source = set_source
        store = open_store(Path(data_dir), url, key_prefix=prefix, compact_min_records=40)
        store.log.config = type(store.log.config)(**{**store.log.config.__dict__, "compact_check_s": 0.0})
    i = 0
    while True:
        store.add_document("ns", "c", f"d{i % 10}", f"v{i}", np.array([i, 1, 2], dtype=np.int32))
        print(i, flush=True)  # printed only once the append was acknowledged
        i += 1
""")


def run_until_killed(backend: str, where: str, data_dir: Path, url: str = "", prefix: str = "") -> int:
    """Run the churning child until it kills itself at ``where``; return the last acknowledged i."""
    proc = subprocess.run([sys.executable, "-c", CHILD, backend, where, str(data_dir), url, prefix],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, f"no kill at {where!r}: {proc.returncode}\n{proc.stderr[-3000:]}"
    acked = [int(line) for line in proc.stdout.split()]
    assert acked, proc.stderr[-3000:]
    return acked[-1]


def assert_nothing_acknowledged_lost(state: StoreState, last: int) -> None:
    for d in range(DOCS):
        newest = max(i for i in range(last + 1) if i % DOCS == d)
        doc = state.get_document("ns", "c", f"d{d}")
        assert doc is not None and int(doc.text[1:]) >= newest, (d, newest, doc)


@pytest.mark.parametrize("where", ["before", "snapshot", "fsynced", "renamed"])
def test_kill_9_at_every_step_of_an_embedded_compaction_loses_nothing_acknowledged(tmp_path: Path,
                                                                                  where: str):
    data_dir = tmp_path / "data"
    last = run_until_killed("embedded", where, data_dir)
    store = open_store(data_dir, None)
    assert not (data_dir / "store.log.compact").exists()
    assert_nothing_acknowledged_lost(store.state, last)
    replayed = store.health()["replayed"]
    if where == "renamed":
        assert replayed < last  # the compacted log is the one in use
    else:
        assert replayed >= last + 1  # the whole old log is
    store.add_document("ns", "c", "after", "after the crash", toks(9))
    digest = store.state.digest()
    store.close()
    reopened = open_store(data_dir, None)
    assert reopened.state.digest() == digest
    reopened.close()


@pytest.mark.parametrize("where", ["before", "after"])
def test_kill_9_around_a_redis_compaction_loses_nothing_and_replicas_converge(
        tmp_path: Path, redis_server: RedisServer, redis_config, wait_until, store_closer, where: str):
    prefix = f"test:{uuid.uuid4().hex[:12]}:"
    watcher = store_closer(Store(RedisLog(redis_config(redis_server.url, prefix, compact_ratio=0))))
    watcher.start()  # a replica that follows the whole churn and the compaction (and never compacts)
    last = run_until_killed("redis", where, tmp_path / "child", redis_server.url, prefix)
    late = store_closer(Store(RedisLog(redis_config(redis_server.url, prefix))))
    late.start()  # a replica started after it: snapshot (if any) + tail
    for replica in (watcher, late):
        assert_nothing_acknowledged_lost(replica.state, last)
    assert wait_until(lambda: watcher.state.digest() == late.state.digest(), 5.0)
    with redis_server.client() as client:
        length = client.xlen(f"{prefix}{{log}}:documents")
        has_snapshot = client.exists(f"{prefix}{{log}}:snapshot")
    if where == "after":
        assert has_snapshot and length < last
        assert late.health()["snapshots_loaded"] == 1
    else:
        assert not has_snapshot and length >= last + 1


def test_a_redis_replica_reading_behind_a_compaction_applies_the_snapshot(
        redis_server: RedisServer, redis_config, wait_until, store_closer):
    """A replica whose cursor is older than the compaction's cut (lagging, back from an outage) must
    not miss the trimmed entries: it sees the newer cut after its read and applies the snapshot."""
    prefix = f"test:{uuid.uuid4().hex[:12]}:"
    writer = store_closer(Store(RedisLog(redis_config(redis_server.url, prefix, compact_min_records=50,
                                                      compact_check_s=0.0))))
    writer.start()
    churn(writer, 3)
    behind = RedisLog(redis_config(redis_server.url, prefix))
    lagging = store_closer(Store(behind))
    behind.replay(lagging.state.apply)  # replayed up to here; follows only later
    reference = StoreState()
    writer.add_document("ns", "c", "keeper", "written once, then trimmed away", toks(7))
    for record in writer.state.live_records():
        reference.apply(record)
    churn(writer, 40, reference)
    assert wait_until(lambda: writer.health()["compactions"] >= 1, 5.0)
    with redis_server.client() as client:
        assert client.xlen(f"{prefix}{{log}}:documents") < 40 * (DOCS + 1)
    behind.start_following(lagging.state.apply)
    lagging._started = True
    assert wait_until(lambda: lagging.state.digest() == writer.state.digest(), 5.0)
    assert behind.snapshots_loaded >= 1
    assert lagging.state.list_documents("ns", "c") == reference.list_documents("ns", "c")
