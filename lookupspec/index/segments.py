"""Immutable suffix-array segments and the log-structured set of them behind corpus and output indexes.

A **segment** is a batch of documents laid out as ``doc SEP doc SEP ...`` with its suffix array
(``suffix_array.py``): 8 bytes per token plus the document table. Segments never change once
published: deleting a document publishes a copy whose suffix array no longer holds that document's
starts (a linear filter; the text is shared); when dead tokens outweigh live ones the segment is
rebuilt from its live documents.

A **segment set** keeps segments oldest first and merges like a counter in base 4: after an add, the
two newest segments merge while the older is smaller than four times the newer. So segment sizes
grow geometrically: O(log4 n) segments (every lookup probes each one; about 4 on average for 30k
single-document adds, one after a bulk load or ``compact``), and each token is re-sorted O(log n)
times over its life (a simulation of 30k adds: 19 rewrites per token; a base-2 counter: 14 rewrites
but 7 segments on average; capping the count at 4 instead: 114 rewrites). Merges and rebuilds run
on the writer's thread (in the gateway, the log follower), never on a lookup.

Storage: all segments of a set live in four shared, append-only arrays (an *arena*: text, suffix
arrays, document starts and bases) plus a small segment table, so a lookup hands numba five arrays
whatever the number of segments (a numba typed list would cost ~0.2 us per item access). A new
segment is appended; a segment whose pieces already live in the arena (the text of a segment after a
deletion) is referenced, not copied. When
the arena is full, or garbage (regions no live segment uses) exceeds a quarter of the live bytes,
live segments are copied into a fresh arena sized 1.25x (exactly 1x when it was empty).

Concurrency: writers serialize on a lock, build new segments aside, then publish a new immutable
snapshot with one attribute store; published arena regions are never written again. A lookup reads
the snapshot once, so it sees either the old or the new state, never a mix, and never waits.

Lookup: the longest suffix match is found by a search on its length (max_match first, then galloping
up from min_match and bisecting; a suffix of a match is a match), each probe a binary search per
segment; the evidence is every occurrence with a next token,
or ``max_occurrences`` of them evenly spaced over the segments' ranges in suffix-array order (see
``lookup.py``); ``tree.py`` expands it.

Positions: every document gets a global *base* from a counter at insertion (``len + 1`` per
document, never reused), so ``last_seen`` is stable across merges and deletions and larger means
more recently added.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from lookupspec.warmup import warm_corpus_index

from .lookup import SEP, Continuations, LookupConfig, as_tokens, continuations_from, tail_array
from .serialize import CorruptIndexError
from .suffix_array import build_sa, filter_sa, sa_range, validate_sa
from .tree import OUT_ROWS, Workspace, expand_tree, workspace_size

__all__ = ["Segment", "SegmentSet", "build_segment"]

# Token ids at or above this are remapped to dense ranks before sorting (keys pack 21 bits per token).
_DENSE_LIMIT = (1 << 21) - 2
_GROWTH = 1.25  # arena capacity over live size after a reallocation
_MAX_GARBAGE = 0.25  # reallocate when dead arena regions exceed this fraction of the live ones
_MERGE_RATIO = 4  # the two newest segments merge while the older is smaller than this times the newer
_WS = Workspace()
# Columns of a segment table row: where the segment's text, suffix array and documents are.
T_OFF, T_LEN, O_OFF, O_LEN, D_OFF, D_LEN = range(6)
SEG_COLS = 6


@dataclass(frozen=True, eq=False)
class Segment:
    text: np.ndarray  # [n] int32, documents each followed by SEP
    sa: np.ndarray  # [m] int32, starts of live tokens sorted by their first KEY_DEPTH tokens
    doc_ids: tuple[str, ...]
    doc_starts: np.ndarray  # [d] int64, local start of each document
    doc_lens: np.ndarray  # [d] int64
    doc_bases: np.ndarray  # [d] int64, global position of each document's first token
    alive: np.ndarray  # [d] bool

    @property
    def live_tokens(self) -> int:
        return int(self.sa.shape[0])

    @property
    def dead_tokens(self) -> int:
        return int(self.doc_lens[~self.alive].sum())

    def live_docs(self) -> list[tuple[str, np.ndarray, int]]:
        docs = zip(self.doc_starts, self.doc_lens, self.doc_bases, strict=True)
        return [(self.doc_ids[i], self.text[s:s + n], int(b))
                for i, (s, n, b) in enumerate(docs) if self.alive[i]]

    def without(self, doc_indices: Sequence[int]) -> Segment:
        """This segment with the given documents deleted (their starts filtered out of the array)."""
        alive = self.alive.copy()
        dead = np.zeros(self.text.shape[0], np.bool_)
        for i in doc_indices:
            alive[i] = False
            dead[self.doc_starts[i]:self.doc_starts[i] + self.doc_lens[i]] = True
        return Segment(self.text, filter_sa(self.sa, dead), self.doc_ids, self.doc_starts, self.doc_lens,
                       self.doc_bases, alive)


def _sort_text(text: np.ndarray) -> np.ndarray:
    if text.shape[0] and int(text.max()) >= _DENSE_LIMIT:
        # Order-preserving dense ranks (fewer than 2**21 distinct ids in practice); SEP stays smallest.
        _, inv = np.unique(text, return_inverse=True)
        dense = inv.astype(np.int32) - (1 if (text == SEP).any() else 0)
        return build_sa(dense)
    return build_sa(text)


def build_segment(docs: Sequence[tuple[str, np.ndarray, int]]) -> Segment:
    """docs: (doc_id, tokens [len] int32, global base) in insertion order."""
    lens = np.fromiter((d[1].shape[0] for d in docs), np.int64, len(docs))
    starts = np.zeros(len(docs), np.int64)
    if len(docs) > 1:
        np.cumsum(lens[:-1] + 1, out=starts[1:])
    text = np.full(int(lens.sum()) + len(docs), SEP, np.int32)
    for (_, toks, _), s in zip(docs, starts, strict=True):
        text[s:s + toks.shape[0]] = toks
    return Segment(text, _sort_text(text), tuple(d[0] for d in docs), starts, lens,
                   np.fromiter((d[2] for d in docs), np.int64, len(docs)), np.ones(len(docs), np.bool_))


# -- the arena --------------------------------------------------------------------------------------

class _Arena:
    """Four append-only buffers (text, sa, doc_starts, doc_bases); a region, once handed out, is never
    written again."""

    def __init__(self, caps: Sequence[int]) -> None:
        self.bufs: list[np.ndarray] = [np.empty(caps[0], np.int32), np.empty(caps[1], np.int32),
                                       np.empty(caps[2], np.int64), np.empty(caps[3], np.int64)]
        self.used = [0, 0, 0, 0]

    def offset(self, k: int, arr: np.ndarray) -> int | None:
        """Offset of ``arr`` if it already is a region of buffer k, else None."""
        buf = self.bufs[k]
        if arr.size == 0:
            return 0
        if arr.base is None or not np.may_share_memory(arr, buf):
            return None
        return (arr.__array_interface__["data"][0] - buf.__array_interface__["data"][0]) // buf.itemsize

    def _put(self, k: int, arr: np.ndarray, off: int) -> None:
        self.bufs[k][off:off + arr.size] = arr
        self.used[k] = max(self.used[k], off + arr.size)

    def place(self, seg: Segment) -> tuple[Segment, np.ndarray]:
        """The segment as views into this arena (copying what is not there yet) and its table row. A
        segment already wholly in the arena comes back as the same object."""
        copied = False
        offs: list[int] = []
        for k, arr in enumerate((seg.text, seg.sa)):
            off = self.offset(k, arr)
            if off is None:
                off = self.used[k]
                self._put(k, arr, off)
                copied = True
            offs.append(off)
        # doc_starts and doc_bases share one offset in the segment table: reuse both or copy both.
        d = self.offset(2, seg.doc_starts)
        if d is None or d != self.offset(3, seg.doc_bases):
            d = max(self.used[2], self.used[3])
            self._put(2, seg.doc_starts, d)
            self._put(3, seg.doc_bases, d)
            copied = True
        nd = seg.doc_starts.size
        row = np.array([offs[0], seg.text.size, offs[1], seg.sa.size, d, nd], np.int64)
        if not copied:
            return seg, row
        text = self.bufs[0][offs[0]:offs[0] + seg.text.size]
        sa = self.bufs[1][offs[1]:offs[1] + seg.sa.size]
        placed = Segment(text, sa, seg.doc_ids, self.bufs[2][d:d + nd], seg.doc_lens, self.bufs[3][d:d + nd],
                         seg.alive)
        return placed, row


def _arrays(seg: Segment) -> tuple[np.ndarray, ...]:
    return (seg.text, seg.sa, seg.doc_starts, seg.doc_bases)


# -- kernels ----------------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _probe(text, order, segtab, tail, L, lo_buf, hi_buf):
    """Ranges of tail[-L:] in every segment; True if one occurrence is followed by a token."""
    tl = tail.shape[0]
    ok = False
    for s in range(segtab.shape[0]):
        t0 = segtab[s, T_OFF]
        tn = segtab[s, T_LEN]
        o0 = segtab[s, O_OFF]
        lo, hi = sa_range(text, t0, tn, order, o0, segtab[s, O_LEN], tail, tl - L, L)
        lo_buf[s] = lo
        hi_buf[s] = hi
        if hi > lo:  # SEP sorts first in a range: the last entry has a next token if any has
            last = order[o0 + hi - 1] + L
            if last < tn and text[t0 + last] >= 0:
                ok = True
    return ok


@njit(cache=True, nogil=True)
def _lookup(text, order, dstart, dbase, segtab, tail, min_match, max_match, width, max_depth, max_nodes,
            max_occ, ws, out, at):
    """ws: int64 scratch of workspace_size(width, max_nodes, max_occ) + 2 * max_occ + 5 * segments;
    the tree goes to out[:, at:]. Returns (match_len, nodes, num_occurrences)."""
    ns = segtab.shape[0]
    tl = tail.shape[0]
    usable = 0  # a negative id never matches: only the suffix after it is used
    while usable < tl and tail[tl - 1 - usable] >= 0:
        usable += 1
    lmax = min(max_match, usable)
    if lmax < min_match or ns == 0:
        return 0, 0, 0
    base = ws.shape[0] - 2 * max_occ - 5 * ns
    occ = ws[base:base + 2 * max_occ].reshape((2, max_occ))
    q = base + 2 * max_occ
    lo_buf = ws[q:q + ns]
    hi_buf = ws[q + ns:q + 2 * ns]
    best_lo = ws[q + 2 * ns:q + 3 * ns]
    best_hi = ws[q + 3 * ns:q + 4 * ns]
    first = ws[q + 4 * ns:q + 5 * ns]
    # Longest L with a usable occurrence (monotone in L: a suffix of a match is a match with the same
    # next token). max_match first (long copies are the common hit); else a galloping search up
    # from min_match (short matches are the other common case), then bisection.
    good = 0
    bad = lmax + 1
    if _probe(text, order, segtab, tail, lmax, lo_buf, hi_buf):
        good = lmax
        best_lo[:] = lo_buf
        best_hi[:] = hi_buf
    else:
        bad = lmax
        if not _probe(text, order, segtab, tail, min_match, lo_buf, hi_buf):
            return 0, 0, 0
        good = min_match
        best_lo[:] = lo_buf
        best_hi[:] = hi_buf
        step = 1
        while good + step < bad:
            if _probe(text, order, segtab, tail, good + step, lo_buf, hi_buf):
                good += step
                best_lo[:] = lo_buf
                best_hi[:] = hi_buf
                step <<= 1
            else:
                bad = good + step
                break
        while bad - good > 1:
            mid = (good + bad) >> 1
            if _probe(text, order, segtab, tail, mid, lo_buf, hi_buf):
                good = mid
                best_lo[:] = lo_buf
                best_hi[:] = hi_buf
            else:
                bad = mid
    L = good
    # Entries followed by SEP (no next token) sort first in each range: skip them.
    total = 0
    for s in range(ns):
        t0 = segtab[s, T_OFF]
        tn = segtab[s, T_LEN]
        o0 = segtab[s, O_OFF]
        a = best_lo[s]
        b = best_hi[s]
        while a < b:
            mid = (a + b) >> 1
            p = order[o0 + mid] + L
            if p < tn and text[t0 + p] >= 0:
                b = mid
            else:
                a = mid + 1
        first[s] = a
        total += best_hi[s] - a
    # Evidence: all of them, or the midpoints of max_occ equal strata of the concatenated ranges.
    m = min(total, max_occ)
    s = 0
    seen = 0  # entries of the segments before s
    for i in range(m):
        idx = i if total <= max_occ else ((2 * i + 1) * total) // (2 * max_occ)
        while idx - seen >= best_hi[s] - first[s]:
            seen += best_hi[s] - first[s]
            s += 1
        p = order[segtab[s, O_OFF] + first[s] + idx - seen] + L  # local position of the next token
        occ[0, i] = segtab[s, T_OFF] + p
        dlo = segtab[s, D_OFF]  # its document: the last one starting at or before p
        dhi = dlo + segtab[s, D_LEN]
        while dhi - dlo > 1:
            mid = (dlo + dhi) >> 1
            if dstart[mid] <= p:
                dlo = mid
            else:
                dhi = mid
        occ[1, i] = dbase[dlo] + (p - dstart[dlo])
    n_out = expand_tree(text, text.shape[0], occ, m, width, max_depth, max_nodes, ws[:base], out, at)
    return L, n_out, m


# -- the set ----------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class _Snapshot:
    segments: tuple[Segment, ...]
    arrays: tuple[np.ndarray, ...]  # the arena buffers: text, sa, doc_starts, doc_bases
    segtab: np.ndarray  # [segments, SEG_COLS] int64


_EMPTY = _Snapshot((), (), np.zeros((0, SEG_COLS), np.int64))


class SegmentSet:
    """Documents in immutable segments; thread-safe (see the module docstring)."""

    def __init__(self, *, auto_merge: bool = True) -> None:
        self.auto_merge = auto_merge
        self._lock = threading.RLock()
        self._snap = _EMPTY
        self._arena = _Arena([0, 0, 0, 0])
        self._where: dict[str, tuple[Segment, int]] = {}  # live doc id -> (segment, index in it)
        self._next_base = 0
        self._tokens = 0
        warm_corpus_index()  # compile (or load) the kernels now, not mid-request

    # -- reads (lock-free) ------------------------------------------------------------------------
    @property
    def segments(self) -> tuple[Segment, ...]:
        return self._snap.segments

    def lookup(self, tail: np.ndarray, cfg: LookupConfig) -> Continuations:
        out = np.empty((OUT_ROWS, cfg.max_nodes), np.int64)
        L, n, num = self.lookup_into(tail, cfg, out, 0)
        return continuations_from(out, 0, L, n, num)

    def lookup_into(self, tail: np.ndarray, cfg: LookupConfig, out: np.ndarray,
                    at: int) -> tuple[int, int, int]:
        snap = self._snap
        tail = tail_array(tail)
        if not snap.segments or tail.shape[0] == 0:
            return 0, 0, 0
        text, sa, dstart, dbase = snap.arrays
        k = cfg.max_occurrences
        ws = _WS.get(workspace_size(cfg.width, cfg.max_nodes, k) + 2 * k + 5 * snap.segtab.shape[0])
        return _lookup(text, sa, dstart, dbase, snap.segtab, tail, cfg.min_match, cfg.max_match, cfg.width,
                       cfg.max_depth, cfg.max_nodes, k, ws, out, at)

    def __len__(self) -> int:
        return self._tokens

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._where

    @property
    def num_documents(self) -> int:
        return len(self._where)

    def memory_bytes(self) -> int:
        """Bytes of the arena buffers (capacity, garbage included) and the document tables."""
        snap = self._snap
        return int(sum(a.nbytes for a in snap.arrays)
                   + sum(s.doc_lens.nbytes + s.alive.nbytes for s in snap.segments))

    # -- writes ------------------------------------------------------------------------------------
    def _publish(self, segments: list[Segment], deleted: Sequence[str] = ()) -> None:
        """Place ``segments`` in the arena and make them the current state."""
        live = np.zeros(4, np.int64)
        new = np.zeros(4, np.int64)
        for seg in segments:
            for k, arr in enumerate(_arrays(seg)):
                live[k] += arr.size
                if self._arena.offset(k, arr) is None:
                    new[k] += arr.size
        arena = self._arena
        caps = np.array([b.shape[0] for b in arena.bufs])
        used = np.array(arena.used)
        if np.any(used + new > caps) or np.any(used + new - live > _MAX_GARBAGE * live + 1024):
            fresh = not used.any()  # first fill (a bulk load): exact fit
            arena = _Arena([int(x) if fresh else int(x * _GROWTH) + 1024 for x in live])
        placed, rows = [], []
        for seg in segments:
            p, row = arena.place(seg)
            placed.append(p)
            rows.append(row)
        self._arena = arena
        for doc_id in deleted:
            self._where.pop(doc_id, None)
        # Register the documents of every segment object that is new (built, filtered, or copied
        # into a fresh arena); segments carried over unchanged keep their entries.
        old = {id(s) for s in self._snap.segments}
        for seg in placed:
            if id(seg) not in old:
                for i, doc_id in enumerate(seg.doc_ids):
                    if seg.alive[i]:
                        self._where[doc_id] = (seg, i)
        self._tokens = sum(s.live_tokens for s in placed)
        segtab = np.array(rows, np.int64).reshape(len(rows), SEG_COLS)
        self._snap = _Snapshot(tuple(placed), tuple(arena.bufs), segtab)

    def add(self, docs: Iterable[tuple[str, object]]) -> None:
        """Add documents as one new segment (a document id already present is replaced)."""
        with self._lock:
            items: dict[str, np.ndarray] = {}
            for doc_id, tokens in docs:
                if not isinstance(doc_id, str):
                    raise TypeError(f"doc_id must be a str, got {type(doc_id).__name__}")
                items.pop(doc_id, None)  # a repeated id within the batch: the last version wins
                items[doc_id] = as_tokens(tokens)
            if not items:
                return
            batch: list[tuple[str, np.ndarray, int]] = []
            for doc_id, arr in items.items():
                batch.append((doc_id, arr, self._next_base))
                self._next_base += arr.shape[0] + 1
            replaced = [d for d in items if d in self._where]
            segments = self._deleted(list(self._snap.segments), replaced)
            segments.append(build_segment(batch))
            if self.auto_merge:
                while (len(segments) >= 2
                       and segments[-2].live_tokens < _MERGE_RATIO * segments[-1].live_tokens):
                    b = segments.pop()
                    a = segments.pop()
                    segments.append(build_segment(a.live_docs() + b.live_docs()))
            self._publish(segments, replaced)

    def delete(self, doc_ids: Iterable[str]) -> int:
        """Delete documents; unknown ids are ignored. Returns how many were deleted."""
        with self._lock:
            ids = [d for d in dict.fromkeys(doc_ids) if d in self._where]
            if ids:
                self._publish(self._deleted(list(self._snap.segments), ids), ids)
            return len(ids)

    def _deleted(self, segments: list[Segment], ids: list[str]) -> list[Segment]:
        by_seg: dict[int, list[int]] = {}
        for doc_id in ids:
            seg, i = self._where[doc_id]
            by_seg.setdefault(id(seg), []).append(i)
        out = []
        for seg in segments:
            idx = by_seg.get(id(seg))
            if idx:
                seg = seg.without(idx)
                if not seg.alive.any():
                    continue
                if seg.dead_tokens > seg.live_tokens:
                    seg = build_segment(seg.live_docs())
            out.append(seg)
        return out

    def compact(self) -> None:
        """Merge every segment into one, drop deleted documents, and fit the arena to the live data."""
        with self._lock:
            docs = [d for s in self._snap.segments for d in s.live_docs()]
            self._arena = _Arena([0, 0, 0, 0])
            self._publish([build_segment(docs)] if docs else [])

    def oldest_documents(self) -> list[tuple[str, int]]:
        """(doc_id, length) of live documents, oldest first."""
        out = []
        for seg in self._snap.segments:
            for i, doc_id in enumerate(seg.doc_ids):
                if seg.alive[i]:
                    out.append((doc_id, int(seg.doc_lens[i]), int(seg.doc_bases[i])))
        out.sort(key=lambda x: x[2])
        return [(d, n) for d, n, _ in out]

    # -- serialization -----------------------------------------------------------------------------
    def to_payload(self) -> tuple[dict[str, Any], list[np.ndarray]]:
        snap = self._snap
        meta: dict[str, Any] = {"next_base": self._next_base, "segments": []}
        arrays: list[np.ndarray] = []
        for s in snap.segments:
            meta["segments"].append({"doc_ids": list(s.doc_ids)})
            arrays += [s.text, s.sa, s.doc_starts, s.doc_lens, s.doc_bases, s.alive]
        return meta, arrays

    @classmethod
    def from_payload(cls, meta: dict[str, Any], arrays: list[np.ndarray], **kwargs: Any) -> SegmentSet:
        segs_meta = meta.get("segments")
        next_base = meta.get("next_base")
        if not isinstance(segs_meta, list) or not isinstance(next_base, int) or next_base < 0:
            raise CorruptIndexError("bad segment metadata")
        if len(arrays) != 6 * len(segs_meta):
            raise CorruptIndexError("array count does not match the segment table")
        segments = []
        all_ids: set[str] = set()
        dtypes = (np.int32, np.int32, np.int64, np.int64, np.int64, np.bool_)
        for k, sm in enumerate(segs_meta):
            text, sa, starts, lens, bases, alive = arrays[6 * k:6 * k + 6]
            ids = sm.get("doc_ids") if isinstance(sm, dict) else None
            if (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)
                    or any(a.dtype != t for a, t in zip(arrays[6 * k:6 * k + 6], dtypes, strict=True))):
                raise CorruptIndexError(f"segment {k}: bad layout")
            _check_docs(k, text, starts, lens, bases, alive, len(ids), next_base)
            live = np.zeros(text.shape[0], np.bool_)
            for s, n, a in zip(starts, lens, alive, strict=True):
                if a:
                    live[s:s + n] = True
            code = validate_sa(text, sa, live)
            if code:
                raise CorruptIndexError(f"segment {k}: invalid suffix array (check {code})")
            for i, doc_id in enumerate(ids):
                if alive[i]:
                    if doc_id in all_ids:
                        raise CorruptIndexError(f"duplicate live document id {doc_id!r}")
                    all_ids.add(doc_id)
            segments.append(Segment(text, sa, tuple(ids), starts, lens, bases, alive))
        out = cls(**kwargs)
        out._next_base = next_base
        out._publish(segments)
        return out


def _check_docs(k: int, text: np.ndarray, starts: np.ndarray, lens: np.ndarray, bases: np.ndarray,
                alive: np.ndarray, n_ids: int, next_base: int) -> None:
    """Document table of segment k: contiguous docs, SEP after each, increasing bases."""
    d = starts.shape[0]
    if not (d == lens.shape[0] == bases.shape[0] == alive.shape[0] == n_ids) or d == 0:
        raise CorruptIndexError(f"segment {k}: document table sizes disagree")
    if (lens < 0).any() or starts[0] != 0 or (bases < 0).any():
        raise CorruptIndexError(f"segment {k}: bad document table")
    ends = starts + lens  # position of each document's SEP
    if (starts[1:] != ends[:-1] + 1).any() or ends[-1] + 1 != text.shape[0]:
        raise CorruptIndexError(f"segment {k}: documents do not tile the text")
    if (bases[1:] < bases[:-1] + lens[:-1] + 1).any() or bases[-1] + lens[-1] + 1 > next_base:
        raise CorruptIndexError(f"segment {k}: document positions overlap")
    if (text[ends] != SEP).any() or int((text == SEP).sum()) != d or (text < SEP).any():
        raise CorruptIndexError(f"segment {k}: separators misplaced")
