"""Embedded log: durability across kill -9, damage detection and recovery, the process lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from lookupspec.store import (
    EmbeddedConfig,
    EmbeddedLog,
    Store,
    StoreClosedError,
    StoreLockedError,
    open_store,
)
from lookupspec.store.embedded import encode_frame
from lookupspec.store.records import AppendOutput, encode_record

WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    import numpy as np
    from lookupspec.store import open_store

    store = open_store(Path(sys.argv[1]), None)
    i = 0
    while True:
        store.add_document("ns", "c", f"d{i}", "payload " * 40, np.arange(i % 50 + 1, dtype=np.int32))
        print(f"d{i}", flush=True)  # only after the append was acknowledged (fsynced)
        i += 1
""")


def test_acknowledged_writes_survive_kill_9(tmp_path: Path):
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(data)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    acked: list[str] = []
    try:
        assert proc.stdout is not None
        while len(acked) < 60:
            line = proc.stdout.readline()
            assert line, f"writer died: {proc.stderr.read() if proc.stderr else ''}"
            acked.append(line.strip())
    finally:
        proc.send_signal(signal.SIGKILL)  # mid-write, most likely: the writer never pauses
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]

    with open_store(data, None) as store:
        assert all(store.state.has_document("ns", "c", doc_id) for doc_id in acked)
        health = store.health()
        assert health["state"] == "ok"
        # kill -9 may have cut a frame in half: then it was truncated, never skipped mid-log
        assert health["skipped_bytes"] == 0
        count = store.health()["documents"]
        store.add_document("ns", "c", "after-kill", "t", np.array([1], np.int32))
    with open_store(data, None) as store:
        assert store.health()["documents"] == count + 1
        assert store.health()["corrupt_regions"] == 0


def _fill(data: Path, n: int) -> list[int]:
    """Append n outputs; return each frame's offset (plus the end of the log)."""
    with open_store(data, None) as store:
        offsets = [int(store.append_output("ns", np.array([i, i, i], np.int32)).offset) for i in range(n)]
        return [*offsets, store.health()["log_bytes"]]


def _outputs(store: Store) -> list[int]:
    return [int(t[0]) for t in store.state.outputs("ns")]


def test_torn_tail_is_truncated_reported_and_later_appends_survive(tmp_path: Path):
    data = tmp_path / "data"
    _fill(data, 3)
    frame = encode_frame(encode_record(AppendOutput("ns", np.arange(100, dtype=np.int32))))
    with open(data / "store.log", "ab") as f:
        f.write(frame[: len(frame) // 2])  # what kill -9 in the middle of a write leaves

    with open_store(data, None) as store:
        health = store.health()
        assert _outputs(store) == [0, 1, 2]
        assert health["state"] == "ok"
        assert (health["corrupt_regions"], health["truncated_bytes"]) == (1, len(frame) // 2)
        assert "torn or corrupt tail" in health["last_error"]
        store.append_output("ns", np.array([3, 3, 3], np.int32))
    assert len(list(data.glob("store.log.corrupt-*"))) == 1

    with open_store(data, None) as store:
        assert _outputs(store) == [0, 1, 2, 3]
        assert store.health()["corrupt_regions"] == 0  # the torn bytes are gone for good


@pytest.mark.parametrize("where", ["payload", "length field"])
def test_bit_flip_mid_log_is_skipped_and_reported_and_later_appends_survive(tmp_path: Path, where: str):
    data = tmp_path / "data"
    offsets = _fill(data, 5)
    flip_at = offsets[2] + (20 if where == "payload" else 5)
    with open(data / "store.log", "r+b") as f:
        f.seek(flip_at)
        byte = f.read(1)[0]
        f.seek(flip_at)
        f.write(bytes([byte ^ 0x10]))

    with open_store(data, None) as store:
        health = store.health()
        assert _outputs(store) == [0, 1, 3, 4]
        assert (health["corrupt_regions"], health["skipped_bytes"]) == (1, offsets[3] - offsets[2])
        assert "corrupt region" in health["last_error"]
        store.append_output("ns", np.array([5, 5, 5], np.int32))

    with open_store(data, None) as store:
        assert _outputs(store) == [0, 1, 3, 4, 5]
        assert store.health()["corrupt_regions"] == 1  # still in the file, reported again


def test_garbage_file_is_not_fatal(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "store.log").write_bytes(os.urandom(5000))
    with open_store(data, None) as store:
        assert store.health()["truncated_bytes"] == 5000
        store.append_output("ns", np.array([7], np.int32))
    with open_store(data, None) as store:
        assert [t.tolist() for t in store.state.outputs("ns")] == [[7]]


def test_one_process_per_data_directory(tmp_path: Path):
    first = open_store(tmp_path, None)
    try:
        with pytest.raises(StoreLockedError):
            EmbeddedLog(EmbeddedConfig(tmp_path))
    finally:
        first.close()
    open_store(tmp_path, None).close()  # released on close


def test_appends_need_a_started_store(tmp_path: Path):
    store = Store(EmbeddedLog(EmbeddedConfig(tmp_path)))
    try:
        with pytest.raises(StoreClosedError):
            store.append_output("ns", np.array([1], np.int32))
    finally:
        store.close()


def test_config_validation():
    with pytest.raises(ValueError):
        EmbeddedConfig(Path("x"), log_name="../escape")
