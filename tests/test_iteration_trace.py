"""The iteration trace: a start line per opening, one JSON record per call with ``t`` first, floats
rounded, appended across restarts, nothing written after close."""

from __future__ import annotations

import json

from lookupspec.iteration_trace import IterationTrace


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_records_are_appended_line_by_line_and_survive_a_restart(tmp_path) -> None:
    path = tmp_path / "deep" / "trace.jsonl"
    trace = IterationTrace(path)
    trace.record(forward_s=0.0123456789, sequences=3, budget=None)
    # line-buffered: the record is in the file before close
    first = _lines(path)
    assert first[0].keys() == {"start", "unix"} and len(first) == 2
    assert list(first[1]) == ["t", "forward_s", "sequences", "budget"]
    assert first[1]["forward_s"] == 0.012346 and first[1]["sequences"] == 3 and first[1]["budget"] is None
    assert first[1]["t"] >= 0
    trace.close()
    trace.record(forward_s=1.0)  # after close: dropped
    again = IterationTrace(path)  # a restarted server appends
    again.record(forward_s=0.5)
    again.close()
    lines = _lines(path)
    assert [("start" in r) for r in lines] == [True, False, True, False]
    # the record after close was dropped, and is not counted as written
    assert lines[-1]["forward_s"] == 0.5 and trace.records == 1 and again.records == 1
