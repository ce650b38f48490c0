"""The fixed shapes a static step runs in: buckets of rows and sequences.

A CUDA graph replays one set of shapes, so a step's rows (decode rows, draft trees, prompt chunks)
are laid into the smallest :class:`Bucket` that holds them, and the rest of the bucket is padding
(:mod:`.layout`). A bucket is ``rows`` (every row of every sequence, padded rows included) by
``seqs`` (the sequences the per-sequence tables have room for).

Why powers of two, and rows rather than sequences x rows per sequence:

- A decode or verification step reads every weight once whatever its row count (a forward over 1 and
  over 64 rows costs about the same on a GPU until the matrix products turn compute-bound), so a
  padded row costs almost nothing; what padding wastes is capture memory and graphs. Powers of two
  waste less than half a bucket and keep the graph count at ``len(rows) x len(seqs)``, a few dozen.
- Total rows, not ``seqs x rows_per_seq``: a step mixes one 32-node tree with seven decode rows, and
  a rows-per-sequence grid would pad every sequence to the widest one (8 x 33 rows for 39 real ones).
  Each row carries its own sequence's slot, cache length and tree bits, so attention needs no
  per-sequence shape at all; ``seqs`` only sizes the per-sequence tables (verification's row offsets).
- The draft budget fills a bucket's free rows with the next-best draft nodes (issue 50): a 17-row
  step (a 16-node tree and its root) runs in the 32-row bucket, so 15 more nodes are free.

Example: ``BucketConfig().choose(rows=17, seqs=1)`` is ``Bucket(rows=32, seqs=1)``;
``choose(rows=64, seqs=8)`` is ``Bucket(64, 8)``; ``choose(rows=3, seqs=5)`` is None (five sequences
need five rows at least: the request is malformed), and so is anything past the largest bucket
(the caller runs it eagerly, with a reason).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Bucket", "BucketConfig"]

ROW_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SEQ_SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True, order=True)
class Bucket:
    """One static shape: ``rows`` rows in all, tables for ``seqs`` sequences (``seqs <= rows``)."""

    rows: int
    seqs: int

    def __post_init__(self) -> None:
        if not 1 <= self.seqs <= self.rows:
            raise ValueError(f"a bucket needs 1 <= seqs <= rows, got {self.seqs} sequences in "
                             f"{self.rows} rows")

    @property
    def words(self) -> int:
        """int64 words of tree bits per row: one bit for each row its sequence may have."""
        return -(-self.rows // 64)


@dataclass(frozen=True)
class BucketConfig:
    """The buckets a static step may use: every ``(rows, seqs)`` pair with ``seqs <= rows``."""

    rows: tuple[int, ...] = ROW_SIZES
    seqs: tuple[int, ...] = SEQ_SIZES

    def __post_init__(self) -> None:
        for name, sizes in (("rows", self.rows), ("seqs", self.seqs)):
            if not sizes or list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
                raise ValueError(f"bucket {name} must be distinct positive sizes in increasing order, "
                                 f"got {sizes}")
        if self.seqs[0] > self.rows[0]:
            raise ValueError(f"the smallest bucket has {self.rows[0]} rows, too few for {self.seqs[0]} "
                             "sequences")

    @property
    def max_rows(self) -> int:
        return self.rows[-1]

    @property
    def max_seqs(self) -> int:
        return self.seqs[-1]

    def choose(self, rows: int, seqs: int) -> Bucket | None:
        """The smallest bucket for ``rows`` rows of ``seqs`` sequences, or None when none holds them."""
        if seqs < 1 or rows < seqs:
            return None
        r = next((r for r in self.rows if r >= rows), None)
        s = next((s for s in self.seqs if s >= seqs), None)
        if r is None or s is None:
            return None
        return Bucket(r, s) if s <= r else None

    def all(self) -> list[Bucket]:
        """Every bucket, largest first (the order to capture graphs that share one memory pool)."""
        return sorted((Bucket(r, s) for r in self.rows for s in self.seqs if s <= r), reverse=True)

    def why_not(self, rows: int, seqs: int) -> str:
        """Why :meth:`choose` found no bucket (for the eager fallback's log line)."""
        if seqs < 1 or rows < seqs:
            return f"{rows} rows cannot hold {seqs} sequences"
        if rows > self.max_rows:
            return f"{rows} rows exceed the largest bucket ({self.max_rows} rows)"
        if seqs > self.max_seqs:
            return f"{seqs} sequences exceed the largest bucket ({self.max_seqs} sequences)"
        return f"no bucket of {rows} rows has room for {seqs} sequences"
