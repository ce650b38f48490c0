"""What a static step costs, bucket by bucket.

Where the static step serves (:mod:`lookupspec.runtime.static`: CUDA graphs), a step's rows are laid
into the smallest bucket that holds them and the bucket runs whole, padding included, so a step
costs what its bucket costs, not what its rows would: a 17-row step and a 32-row step both replay the
32-row graph. :class:`BucketCosts` keeps that price per bucket, measured (an exponential average of
the steps that ran in it, outliers capped: :func:`~lookupspec.cost.step.capped_average`), and hands
the draft budget (:func:`lookupspec.cost.draft.allocate`) a bucket's row count and price for any step
size, so that the budget fills a bucket's free rows with the next-best draft nodes instead of
leaving them as padding. An unmeasured bucket has no price yet; the budget then prices it by the
linear step model at the bucket's full size.

Example: with buckets of 16 and 32 rows measured at 2.0 and 2.1 ms, ``lookup(17, 1)`` is ``(32,
0.0021)``: a step that would take 17 rows may take 32 for 0.1 ms more than a 16-row one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Protocol

from .step import capped_average

__all__ = ["BucketCosts"]


class _Bucket(Hashable, Protocol):
    rows: int


class BucketCosts:
    """Seconds per bucket. ``choose(rows, seqs)``: the bucket a step of that shape runs in (None: no
    bucket holds it); ``memory``: the average's weight on the past. Thread-safe."""

    def __init__(self, choose: Callable[[int, int], _Bucket | None], memory: float = 0.8) -> None:
        self.choose = choose
        self.memory = memory
        self._seconds: dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def observe(self, bucket: _Bucket, seconds: float) -> None:
        """A step ran in ``bucket`` in ``seconds``. A sample over three times the average (another
        process slowed the step) is capped."""
        if seconds <= 0:
            return
        with self._lock:
            self._seconds[bucket] = capped_average(self._seconds.get(bucket), seconds, self.memory)

    def seconds(self, bucket: _Bucket) -> float | None:
        with self._lock:
            return self._seconds.get(bucket)

    def lookup(self, rows: int, seqs: int) -> tuple[int, float | None] | None:
        """The rows of the bucket a step of ``rows`` rows and ``seqs`` sequences runs in, and its
        measured seconds (None: not measured yet); None when no bucket holds the step."""
        bucket = self.choose(rows, seqs)
        if bucket is None:
            return None
        return bucket.rows, self.seconds(bucket)

    def lookup_rows(self, seqs: int) -> Callable[[int], tuple[int, float | None] | None]:
        """:meth:`lookup` for steps of ``seqs`` sequences, by rows: what
        :func:`~lookupspec.cost.draft.allocate` takes as ``bucket``."""
        return lambda rows: self.lookup(rows, seqs)

    def known(self) -> int:
        """How many buckets have a price."""
        with self._lock:
            return len(self._seconds)
