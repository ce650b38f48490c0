"""The context index: one per request, the prompt plus every token generated so far.

Structure: **one exact hash chain per n-gram length** ``L = 1..max_ngram`` (hash chains as in LZ77
match finders, but per length so that the head of a chain is always the most recent occurrence of
exactly that n-gram):

- ``table[L - 1]``: open-addressing map from an L-gram to the end position of its most recent
  occurrence (keys are not stored: a probe compares the tokens at that position; linear probing,
  load <= 3/4);
- ``prev[L - 1, j]``: end position of the previous occurrence of the L-gram ending at ``j`` (-1: none).

Why: appending a token inserts ``max_ngram`` grams, O(1) amortized whatever the context length
(arrays grow by doubling; tables rehash from their heads). A lookup probes O(log max_ngram) tables
to find the longest matching suffix, then walks one chain for at most ``max_occurrences`` steps, so it
costs the same at 1k and at 1M tokens. A suffix array cannot absorb appends in O(1), and a suffix
automaton cannot keep occurrence counts online (each append would update every suffix-link
ancestor). The price is memory, about ``4 + 12 * max_ngram`` bytes per token (max_ngram = 8: ~100
bytes/token, 100 MB at 1M tokens), acceptable for a per-request structure.

Semantics (the plain reference in ``reference.py`` implements exactly this):

1. ``L`` = the longest suffix of the tail, up to ``min(max_match, max_ngram)``, with an occurrence
   followed by at least one token (the tail's own occurrence at the end of the context has none).
2. The evidence is the ``max_occurrences`` most recent such occurrences.
3. If ``L == max_ngram < max_match``, each of those occurrences is extended backwards while it keeps
   matching the tail (up to ``max_match``); ``L`` becomes the longest extension and only the
   occurrences reaching it are kept. Matches longer than ``max_ngram`` are therefore found among the
   recent occurrences of the ``max_ngram``-gram only -- exact unless that gram occurs more than
   ``max_occurrences`` times.
4. No match if ``L < min_match``. Otherwise the tree is expanded as in ``lookup.py``.

Worked example: context ``a b c a b d a b``, tail = the context. ``a b`` occurs ending at 1 and 4
(and 7, the tail itself, which has no next token): match_len 2, children ``d`` (end 4, more recent)
and ``c``, each with count 1.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from lookupspec.warmup import warm_context_index

from .lookup import Continuations, LookupConfig, as_tokens, continuations_from, tail_array
from .serialize import CorruptIndexError, pack, unpack
from .tree import OUT_ROWS, expand_tree, workspace_size

__all__ = ["ContextIndex"]

_SEED = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_S32 = np.uint64(32)
_MAX_NGRAM = 32


@njit(cache=True, nogil=True, inline="always")
def _mix(h, t):
    h = (h ^ np.uint64(t)) * _C1
    return h ^ (h >> _S32)


@njit(cache=True, nogil=True, inline="always")
def _slot(h, shift):
    return np.int64((h * _C2) >> shift)


@njit(cache=True, nogil=True)
def _insert(tok, prev, tab, shift, j):
    """Index the grams ending at position j (tok[j] already written)."""
    a = prev.shape[0]
    mask = tab.shape[1] - 1
    h = _SEED
    top = min(a, j + 1)
    for L in range(1, top + 1):
        h = _mix(h, tok[j - L + 1])
        s = _slot(h, shift)
        while True:
            p = tab[L - 1, s]
            if p < 0:
                tab[L - 1, s] = j
                prev[L - 1, j] = -1
                break
            eq = True
            for i in range(L):
                if tok[p - i] != tok[j - i]:
                    eq = False
                    break
            if eq:
                prev[L - 1, j] = p
                tab[L - 1, s] = j
                break
            s = (s + 1) & mask
    for L in range(top + 1, a + 1):
        prev[L - 1, j] = -1


@njit(cache=True, nogil=True)
def _extend(tok, prev, tab, shift, n, new):
    for k in range(new.shape[0]):
        tok[n + k] = new[k]
        _insert(tok, prev, tab, shift, n + k)


@njit(cache=True, nogil=True)
def _rehash(tok, old, new, shift):
    """Move every chain head from ``old`` into the empty ``new`` table (heads are distinct grams)."""
    mask = new.shape[1] - 1
    for L in range(1, old.shape[0] + 1):
        for s0 in range(old.shape[1]):
            p = old[L - 1, s0]
            if p < 0:
                continue
            h = _SEED
            for i in range(L):
                h = _mix(h, tok[p - i])
            s = _slot(h, shift)
            while new[L - 1, s] >= 0:
                s = (s + 1) & mask
            new[L - 1, s] = p


@njit(cache=True, nogil=True)
def _first_valid(tok, n, prev, tab, shift, tail, L):
    """Most recent end position < n - 1 of the tail's L-gram (-1: none)."""
    tl = tail.shape[0]
    mask = tab.shape[1] - 1
    h = _SEED
    for i in range(L):
        h = _mix(h, tail[tl - 1 - i])
    s = _slot(h, shift)
    while True:
        p = tab[L - 1, s]
        if p < 0:
            return -1
        eq = True
        for i in range(L):
            if tok[p - i] != tail[tl - 1 - i]:
                eq = False
                break
        if eq:
            break
        s = (s + 1) & mask
    if p >= n - 1:
        p = prev[L - 1, p]
    return p


@njit(cache=True, nogil=True)
def _lookup(tok, n, prev, tab, shift, tail, min_match, max_match, width, max_depth, max_nodes, max_occ,
            ws, out, at):
    """ws: int64 scratch of workspace_size(width, max_nodes, max_occ) + 3 * max_occ entries; the tree
    goes to out[:, at:]. Returns (match_len, nodes, num_occurrences)."""
    a = prev.shape[0]
    tl = tail.shape[0]
    k = 0
    while k < tl and tail[tl - 1 - k] >= 0:  # a negative id never matches: use the suffix after it
        k += 1
    tail = tail[tl - k:]
    tl = k
    lcap = min(max_match, tl)
    lh = min(a, lcap)
    if lh < 1 or n < 2:
        return 0, 0, 0
    # Longest L in [min(min_match, lh), lh] with a usable occurrence (monotone in L: bisect).
    lo_l = min(min_match, lh)
    if _first_valid(tok, n, prev, tab, shift, tail, lo_l) < 0:
        return 0, 0, 0
    good = lo_l
    bad = lh + 1
    if _first_valid(tok, n, prev, tab, shift, tail, lh) >= 0:
        good = lh
    else:
        bad = lh
    while bad - good > 1:
        mid = (good + bad) >> 1
        if _first_valid(tok, n, prev, tab, shift, tail, mid) >= 0:
            good = mid
        else:
            bad = mid
    L = good
    base = ws.shape[0] - 3 * max_occ
    occ = ws[base:base + 2 * max_occ].reshape((2, max_occ))  # row 0: next position, row 1: global
    ext = ws[base + 2 * max_occ:]
    cnt = 0
    j = _first_valid(tok, n, prev, tab, shift, tail, L)
    while j >= 0 and cnt < max_occ:
        occ[0, cnt] = j + 1
        cnt += 1
        j = prev[L - 1, j]
    if a == L and lcap > a:
        best = L
        for i in range(cnt):
            e = L
            end = occ[0, i] - 1
            while e < lcap and end - e >= 0 and tok[end - e] == tail[tl - 1 - e]:
                e += 1
            ext[i] = e
            if e > best:
                best = e
        kept = 0
        for i in range(cnt):
            if ext[i] == best:
                occ[0, kept] = occ[0, i]
                kept += 1
        cnt = kept
        L = best
    if min_match > L:
        return 0, 0, 0
    for i in range(cnt):
        occ[1, i] = occ[0, i]  # one sequence: global position = index
    n_out = expand_tree(tok, n, occ, cnt, width, max_depth, max_nodes, ws[:base], out, at)
    return L, n_out, cnt


def _next_pow2(x: int) -> int:
    return 1 << max(int(x) - 1, 1).bit_length()


class ContextIndex:
    """Token ids of one request; ``extend`` as tokens are accepted, ``lookup`` each step.

    Not thread-safe: one request, one thread (the engine's decode loop).
    """

    _FORMAT_KIND = "context"

    def __init__(self, tokens: object = None, *, max_ngram: int = 8) -> None:
        if not 1 <= max_ngram <= _MAX_NGRAM:
            raise ValueError(f"max_ngram must be in [1, {_MAX_NGRAM}], got {max_ngram}")
        self._a = int(max_ngram)
        self._n = 0
        self._tok = np.empty(64, np.int32)  # [capacity]
        self._prev = np.empty((self._a, 64), np.int32)  # [max_ngram, capacity]
        self._set_table(np.full((self._a, 128), -1, np.int32))  # [max_ngram, table size (power of 2)]
        self._ws = np.empty(0, np.int64)  # lookup scratch
        warm_context_index()  # compile (or load) the kernels now, not mid-request
        if tokens is not None:
            self.extend(tokens)

    @property
    def max_ngram(self) -> int:
        return self._a

    def __len__(self) -> int:
        return self._n

    @property
    def tokens(self) -> np.ndarray:
        """[n] int32, read-only view of the context."""
        v = self._tok[: self._n]
        v.flags.writeable = False
        return v

    def _set_table(self, tab: np.ndarray) -> None:
        self._tab = tab
        self._shift = np.uint64(64 - (tab.shape[1].bit_length() - 1))  # slot = top bits of the hash

    def extend(self, tokens: object) -> None:
        new = as_tokens(tokens)
        need = self._n + new.shape[0]
        if need > self._tok.shape[0]:
            cap = max(need, 2 * self._tok.shape[0])
            tok = np.empty(cap, np.int32)
            tok[: self._n] = self._tok[: self._n]
            prev = np.empty((self._a, cap), np.int32)
            prev[:, : self._n] = self._prev[:, : self._n]
            self._tok, self._prev = tok, prev
        if 4 * need > 3 * self._tab.shape[1]:
            size = _next_pow2(max(4 * need // 3 + 1, 2 * self._tab.shape[1]))
            old = self._tab
            self._set_table(np.full((self._a, size), -1, np.int32))
            _rehash(self._tok, old, self._tab, self._shift)
        _extend(self._tok, self._prev, self._tab, self._shift, self._n, new)
        self._n = need

    def append(self, token: int) -> None:
        self.extend(np.array([token], np.int32))

    def lookup(self, tail: np.ndarray, cfg: LookupConfig) -> Continuations:
        """Longest suffix match of ``tail`` [t] int32 in the context and its continuation tree."""
        out = np.empty((OUT_ROWS, cfg.max_nodes), np.int64)
        L, n, num = self.lookup_into(tail, cfg, out, 0)
        return continuations_from(out, 0, L, n, num)

    def lookup_into(self, tail: np.ndarray, cfg: LookupConfig, out: np.ndarray,
                    at: int) -> tuple[int, int, int]:
        """``lookup`` writing the tree to ``out`` [5, >= at + max_nodes] int64 (see ``TokenIndex``)."""
        tail = tail_array(tail)
        if self._n < 2 or tail.shape[0] == 0:
            return 0, 0, 0
        k = cfg.max_occurrences
        need = workspace_size(cfg.width, cfg.max_nodes, k) + 3 * k
        if self._ws.shape[0] < need:  # the kernel carves from both ends: larger is fine
            self._ws = np.empty(need, np.int64)
        return _lookup(self._tok, self._n, self._prev, self._tab, self._shift, tail, cfg.min_match,
                       cfg.max_match, cfg.width, cfg.max_depth, cfg.max_nodes, k, self._ws, out, at)

    def memory_bytes(self) -> int:
        return int(self._tok.nbytes + self._prev.nbytes + self._tab.nbytes)

    def to_bytes(self) -> bytes:
        """Only the tokens are stored: the chains are a function of them, rebuilt by ``from_bytes``."""
        return pack(self._FORMAT_KIND, {"max_ngram": self._a, "n": self._n}, [self._tok[: self._n]])

    @classmethod
    def from_bytes(cls, data: bytes) -> ContextIndex:
        meta, arrays = unpack(data, cls._FORMAT_KIND, ["int32"])
        a = meta.get("max_ngram")
        if not isinstance(a, int) or not 1 <= a <= _MAX_NGRAM or meta.get("n") != arrays[0].shape[0]:
            raise CorruptIndexError("context index: bad metadata")
        if arrays[0].size and int(arrays[0].min()) < 0:
            raise CorruptIndexError("context index: negative token id")
        return cls(arrays[0], max_ngram=a)
