"""Best-first expansion of a continuation tree over a list of occurrences (numba).

Every store reduces a lookup to the same problem. It finds the longest matching suffix and picks
the *evidence*: at most ``max_occurrences`` occurrences of it (the context index: the most recent;
suffix-array stores: evenly spaced in suffix-array order, i.e. a sample stratified by continuation).
Each occurrence is two numbers:

- ``pos``:  index in ``text`` of the first token after the match (the node at depth d reads
  ``text[pos + d - 1]``; reading stops at SEP or at ``limit``);
- ``glob``: the store-wide position of that token (``last_seen`` of a node at depth d is
  ``max(glob) + d - 1`` over its occurrences: positions are consecutive inside a document).

A node of the tree is a slice of the occurrence list. Expanding it sorts the slice (stably) by the
token at the node's depth, so its children are runs of the slice: their sizes are the counts. The
ranking and emission order are defined in ``lookup.py``; nothing is allocated per node.

A node with a single occurrence takes a fast path: every queued node then has count 1 and an older
``last_seen``, so its descendants come next in queue order and are read straight off the text.

Performance note: every array passed to an njit function costs an atomic incref and decref at the
call (~25 ns), even when numba inlines it; so the hot loops index arrays directly instead of calling
small helpers, and scratch lives in a few 2-D arrays carved from one workspace.

Worked example (text ``a b c a b d a b c``, matched suffix ``a b``, evidence: the occurrences
ending at 1, 4, 7, so ``pos`` = 2, 5, 8): sorted by the token at depth 1 the list is 2, 8 (``c``)
and 5 (``d``). Children: ``c`` (count 2, last_seen 8), ``d`` (count 1, last_seen 5). Under ``c``:
position 3 holds ``a``; 9 is past the text, so ``c a`` has count 1.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit

__all__ = [
    "OUT_COUNT",
    "OUT_DEPTH",
    "OUT_LAST",
    "OUT_PARENT",
    "OUT_ROWS",
    "OUT_TOKEN",
    "Workspace",
    "expand_tree",
    "workspace_size",
]

# Rows of a tree written to an ``out`` buffer.
OUT_TOKEN, OUT_PARENT, OUT_COUNT, OUT_LAST, OUT_DEPTH = range(5)
OUT_ROWS = 5
# Rows of the candidate table (one column per queued node).
_C_TOK, _C_CNT, _C_LAST, _C_DEPTH, _C_PAR, _C_LO, _C_HI, _C_HEAP = range(8)
_C_ROWS = 8
# Rows of the run table (one column per child found while expanding a node).
_R_TOK, _R_LO, _R_HI, _R_LAST, _R_TAKEN = range(5)
_R_ROWS = 5


def workspace_size(width: int, max_nodes: int, max_occ: int) -> int:
    """int64 entries of scratch ``expand_tree`` needs (see ``Workspace``)."""
    return _C_ROWS * width * (max_nodes + 1) + _R_ROWS * (max_occ + 1) + 2 * max_occ


class Workspace(threading.local):
    """Scratch memory for the kernels, one buffer per thread, grown on demand: a lookup allocates
    nothing (an allocation inside numba costs about 0.1 us; a lookup would need ~30)."""

    def __init__(self) -> None:
        self.buf = np.empty(4096, np.int64)

    def get(self, n: int) -> np.ndarray:
        if self.buf.shape[0] < n:
            self.buf = np.empty(max(n, 2 * self.buf.shape[0]), np.int64)
        return self.buf


@njit(cache=True, nogil=True)
def _heap_push(cand, size, c):
    """Push candidate c on the heap in cand[_C_HEAP]; queue order: count desc, last_seen desc,
    depth asc, token asc (comparisons written out: see the module's performance note)."""
    i = size
    cand[_C_HEAP, i] = c
    while i > 0:
        p = (i - 1) >> 1
        a = cand[_C_HEAP, i]
        b = cand[_C_HEAP, p]
        if cand[_C_CNT, a] != cand[_C_CNT, b]:
            up = cand[_C_CNT, a] > cand[_C_CNT, b]
        elif cand[_C_LAST, a] != cand[_C_LAST, b]:
            up = cand[_C_LAST, a] > cand[_C_LAST, b]
        elif cand[_C_DEPTH, a] != cand[_C_DEPTH, b]:
            up = cand[_C_DEPTH, a] < cand[_C_DEPTH, b]
        else:
            up = cand[_C_TOK, a] < cand[_C_TOK, b]
        if not up:
            break
        cand[_C_HEAP, i] = b
        cand[_C_HEAP, p] = a
        i = p
    return size + 1


@njit(cache=True, nogil=True)
def _heap_pop(cand, size):
    top = cand[_C_HEAP, 0]
    size -= 1
    cand[_C_HEAP, 0] = cand[_C_HEAP, size]
    i = 0
    while True:
        a = 2 * i + 1
        if a >= size:
            break
        b = a + 1
        if b < size:
            x = cand[_C_HEAP, a]
            y = cand[_C_HEAP, b]
            if cand[_C_CNT, y] != cand[_C_CNT, x]:
                right = cand[_C_CNT, y] > cand[_C_CNT, x]
            elif cand[_C_LAST, y] != cand[_C_LAST, x]:
                right = cand[_C_LAST, y] > cand[_C_LAST, x]
            elif cand[_C_DEPTH, y] != cand[_C_DEPTH, x]:
                right = cand[_C_DEPTH, y] < cand[_C_DEPTH, x]
            else:
                right = cand[_C_TOK, y] < cand[_C_TOK, x]
            if right:
                a = b
        x = cand[_C_HEAP, a]
        y = cand[_C_HEAP, i]
        if cand[_C_CNT, x] != cand[_C_CNT, y]:
            down = cand[_C_CNT, x] > cand[_C_CNT, y]
        elif cand[_C_LAST, x] != cand[_C_LAST, y]:
            down = cand[_C_LAST, x] > cand[_C_LAST, y]
        elif cand[_C_DEPTH, x] != cand[_C_DEPTH, y]:
            down = cand[_C_DEPTH, x] < cand[_C_DEPTH, y]
        else:
            down = cand[_C_TOK, x] < cand[_C_TOK, y]
        if not down:
            break
        cand[_C_HEAP, a] = y
        cand[_C_HEAP, i] = x
        i = a
    return top, size


@njit(cache=True, nogil=True)
def _sort_slice(text, limit, occ, lo, hi, depth, key):
    """Stable sort of the occurrence columns occ[:, lo:hi] by their token at ``depth`` (-1 when the
    text ends); ``key`` is scratch. Insertion sort: slices hold at most max_occurrences entries and
    are mostly presorted (children of a sorted parent)."""
    for i in range(lo, hi):
        p = occ[0, i] + depth - 1
        key[i - lo] = text[p] if p < limit else -1
    if hi - lo > 64:  # big evidence sets (max_occurrences > 64): O(n log n), allocating
        perm = np.argsort(key[:hi - lo], kind="mergesort")
        ks = key[:hi - lo][perm]
        ps = occ[0, lo:hi][perm]
        gs = occ[1, lo:hi][perm]
        key[:hi - lo] = ks
        occ[0, lo:hi] = ps
        occ[1, lo:hi] = gs
        return
    for i in range(lo + 1, hi):
        k = key[i - lo]
        pv = occ[0, i]
        gv = occ[1, i]
        j = i - 1
        while j >= lo and key[j - lo] > k:
            key[j + 1 - lo] = key[j - lo]
            occ[0, j + 1] = occ[0, j]
            occ[1, j + 1] = occ[1, j]
            j -= 1
        key[j + 1 - lo] = k
        occ[0, j + 1] = pv
        occ[1, j + 1] = gv


@njit(cache=True, nogil=True)
def expand_tree(text, limit, occ, n_occ, width, max_depth, max_nodes, ws, out, at):
    """Emit the continuation tree of the occurrences occ[:, :n_occ] (row 0: ``pos``, row 1: ``glob``;
    reordered in place). ``limit``: text length for reads (tokens at or past it read as SEP).
    ``ws``: int64 scratch of ``workspace_size(width, max_nodes, n_occ)`` entries.

    Writes the nodes to ``out`` [5, >= at + max_nodes] int64 columns ``at...``, rows OUT_* (token,
    parent, count, last_seen, depth; parents index the nodes of this tree, -1 = root). Returns the
    number of nodes.
    """
    cap_c = width * (max_nodes + 1)
    cand = ws[:_C_ROWS * cap_c].reshape((_C_ROWS, cap_c))
    q = _C_ROWS * cap_c
    runs = ws[q:q + _R_ROWS * (n_occ + 1)].reshape((_R_ROWS, n_occ + 1))
    q += _R_ROWS * (n_occ + 1)
    key = ws[q:q + n_occ + 1]
    n_cand = 0
    hsize = 0
    n_out = 0
    lo = 0  # node being expanded: occurrences [lo, hi), children at depth d + 1
    hi = n_occ
    d = 0
    parent = -1
    while True:
        _sort_slice(text, limit, occ, lo, hi, d + 1, key)
        # Runs of equal next tokens (SEP / end of text sorts first and has no child).
        nr = 0
        k = lo
        while k < hi:
            t = key[k - lo]
            e = k + 1
            last = occ[1, k]
            while e < hi and key[e - lo] == t:
                if occ[1, e] > last:
                    last = occ[1, e]
                e += 1
            if t >= 0:
                runs[_R_TOK, nr] = t
                runs[_R_LO, nr] = k
                runs[_R_HI, nr] = e
                runs[_R_LAST, nr] = last + d  # glob is the position at depth 1
                runs[_R_TAKEN, nr] = 0
                nr += 1
            k = e
        # The `width` best children by (count desc, last_seen desc): pushed as candidates. Equal
        # (count, last_seen) cannot happen for distinct tokens.
        for _ in range(min(width, nr)):
            best = -1
            for r in range(nr):
                if runs[_R_TAKEN, r]:
                    continue
                if best < 0:
                    best = r
                    continue
                cr = runs[_R_HI, r] - runs[_R_LO, r]
                cb = runs[_R_HI, best] - runs[_R_LO, best]
                if cr > cb or (cr == cb and runs[_R_LAST, r] > runs[_R_LAST, best]):
                    best = r
            runs[_R_TAKEN, best] = 1
            c = n_cand
            n_cand += 1
            cand[_C_TOK, c] = runs[_R_TOK, best]
            cand[_C_CNT, c] = runs[_R_HI, best] - runs[_R_LO, best]
            cand[_C_LAST, c] = runs[_R_LAST, best]
            cand[_C_DEPTH, c] = d + 1
            cand[_C_PAR, c] = parent
            cand[_C_LO, c] = runs[_R_LO, best]
            cand[_C_HI, c] = runs[_R_HI, best]
            hsize = _heap_push(cand, hsize, c)
        # Emit the best queued node; expand it next if it may have children.
        found = False
        while hsize > 0 and n_out < max_nodes:
            c, hsize = _heap_pop(cand, hsize)
            col = at + n_out
            out[OUT_TOKEN, col] = cand[_C_TOK, c]
            out[OUT_PARENT, col] = cand[_C_PAR, c]
            out[OUT_COUNT, col] = cand[_C_CNT, c]
            out[OUT_LAST, col] = cand[_C_LAST, c]
            out[OUT_DEPTH, col] = cand[_C_DEPTH, c]
            n_out += 1
            dd = cand[_C_DEPTH, c]
            if cand[_C_CNT, c] == 1:  # one occurrence: its chain comes next (module docstring)
                pos = occ[0, cand[_C_LO, c]] + dd
                last = cand[_C_LAST, c]
                while dd < max_depth and n_out < max_nodes and pos < limit and text[pos] >= 0:
                    dd += 1
                    last += 1
                    col = at + n_out
                    out[OUT_TOKEN, col] = text[pos]
                    out[OUT_PARENT, col] = n_out - 1
                    out[OUT_COUNT, col] = 1
                    out[OUT_LAST, col] = last
                    out[OUT_DEPTH, col] = dd
                    n_out += 1
                    pos += 1
                continue
            if dd < max_depth and n_out < max_nodes:
                lo = cand[_C_LO, c]
                hi = cand[_C_HI, c]
                d = dd
                parent = n_out - 1
                found = True
                break
        if not found:
            break
    return n_out
