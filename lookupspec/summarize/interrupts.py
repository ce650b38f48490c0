"""Ctrl-C and SIGTERM for a batch job: stop at once, but never in the middle of writing a result.

Inside :meth:`Interrupts.deferred` a signal is only recorded and raised when the block ends, so the
line being written to the output file is always complete; anywhere else it raises
:class:`JobInterrupted` immediately (also inside a model forward, which is safe: nothing is written
there). Handlers are installed only in the main thread (``signal.signal`` requires it) and restored on
exit.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["Interrupts", "JobInterrupted"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class JobInterrupted(KeyboardInterrupt):
    """The job was stopped by ``signum``; the conventional exit status is ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class Interrupts:
    def __init__(self) -> None:
        self._depth = 0
        self._pending: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._depth:
            self._pending = self._pending or signum
            return
        raise JobInterrupted(signum)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Signals arriving inside the block take effect when it ends."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if not self._depth and self._pending is not None:
                signum, self._pending = self._pending, None
                raise JobInterrupted(signum)
