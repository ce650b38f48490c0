"""One JSON line per scheduler iteration: where a server's latency goes, forward by forward.

``lookupspec serve --trace-iterations FILE`` (or ``Scheduler(trace=IterationTrace(path))``) appends a
record for every iteration of the serving loop that ran a forward. The counters of ``/metrics`` say
how much time went to prefill and decode over a run; the trace says which forward carried which prompt
tokens, how long it took and what the chunk budget was when it chose them, so a long inter-token gap
or a slow first token can be traced to the iteration behind it. A record (times in seconds):

- ``t``: when the iteration ended, from the trace's start (``time.perf_counter``);
- ``iteration_s``: the whole iteration (admission, the forward, delivery to the streams);
- ``forward_s`` / ``decode_s``: the engine's forward, and the decode step's share of it (a forward
  that also carried prompt chunks: the step's estimate alone; ``null`` after a failed batched forward);
- ``sequences`` / ``rows`` / ``draft_nodes`` / ``tokens``: sequences that stepped, their rows, the draft
  nodes among those rows, the tokens the step emitted;
- ``chunk_tokens`` / ``chunks``: prompt tokens this forward prefilled, and how many prompts they came from;
- ``budget``: the prompt tokens the scheduler allowed this forward (``null`` without chunks);
- ``waiting`` / ``prefilling``: requests waiting for a slot, and admitted ones still being prefilled,
  when the forward was planned.

The file is line-buffered (each record is in the file when the iteration ends; a write costs a few
microseconds of the loop's time, against forwards of milliseconds) and appended to, so a restarted
server continues it: each start writes a ``{"start": ...}`` line with the wall-clock time first.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["IterationTrace"]


class IterationTrace:
    """Appends JSON lines to ``path`` (created with its parent directories)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()
        self._started = time.perf_counter()
        self.records = 0  # iteration records written
        self._write({"start": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "unix": round(time.time(), 3)})

    def _write(self, record: dict[str, Any]) -> bool:
        line = json.dumps(record, separators=(",", ":"))
        with self._lock:
            if self._file.closed:
                return False
            self._file.write(line + "\n")
            return True

    def record(self, **fields: Any) -> None:
        """One iteration's record; ``t`` (seconds since the trace started) is added first."""
        out: dict[str, Any] = {"t": round(time.perf_counter() - self._started, 6)}
        for key, value in fields.items():
            out[key] = round(value, 6) if isinstance(value, float) else value
        self.records += self._write(out)

    def close(self) -> None:
        """Close the file (later records are dropped)."""
        with self._lock:
            if not self._file.closed:
                self._file.close()
