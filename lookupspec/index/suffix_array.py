"""Suffix arrays sorted to a bounded depth: build, search, filter and validate (numba).

Why a suffix array for immutable segments (corpus documents, earlier outputs):

- **Memory**: 4 bytes of text plus 4 bytes of array per token (plus the document table), half the
  16 bytes/token budget. Suffix trees and automata need tens of bytes per token; hashed n-gram
  tables need one table per n-gram length.
- **Lookups independent of frequency**: all occurrences of a pattern form one contiguous range found
  in O(log n), sorted by what follows them; its size is their exact number and evenly spaced entries
  of it are a sample stratified by continuation, which is all a lookup needs -- no walk over
  occurrences, however many there are.
- **Build speed**: one LSD radix sort of packed 4-token keys (four passes), then re-sorting only the
  groups that still tie (copied spans); deletion is a linear filter (drop the deleted document's
  starts, nothing to re-sort).

Suffixes are sorted by their first ``KEY_DEPTH`` tokens only: a lookup never compares more than
``max_match + max_depth <= KEY_DEPTH`` tokens, and the depth bound caps the work spent on long
repeated spans. Ties past that depth keep an arbitrary order. A string ends at its first SEP.

Text layout: documents concatenated, each followed by ``SEP`` (-1). ``SEP`` is smaller than every
token, so a pattern (tokens >= 0) never matches across a document boundary, and the entries whose
next token is ``SEP`` sort first in any range (the tree code skips them).

Worked example: text ``b a b $`` (``$`` = SEP) has starts 0..2; sorted: ``a b $`` (1), ``b $`` (2),
``b a b $`` (0) -> sa = [1, 2, 0]; the range of pattern ``b`` is [1, 3).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .lookup import KEY_DEPTH

__all__ = ["build_sa", "filter_sa", "sa_range", "validate_sa"]


@njit(cache=True, nogil=True)
def _key(text, i, k, bits):
    """Packed key of the k tokens at i: (token + 1) per digit, most significant first; SEP, the end of
    the text and everything after them pack as 0. Returns (key, whether the key ends the string)."""
    n = text.shape[0]
    key = np.uint64(0)
    ended = False
    sh = np.uint64(bits)
    for t in range(k):
        v = 0
        if not ended:
            if i + t < n and text[i + t] >= 0:
                v = text[i + t] + 1
            else:
                ended = True
        key = (key << sh) | np.uint64(v)
    return key, ended


@njit(cache=True, nogil=True)
def _radix_sort(keys, idx, tmp_k, tmp_i, total_bits):
    """Stable LSD radix sort of (keys, idx) by keys, 16 bits per pass; returns the sorted pair."""
    n = keys.shape[0]
    cnt = np.empty(65537, np.int64)
    shift = 0
    while shift < total_bits:
        sh = np.uint64(shift)
        cnt[:] = 0
        for j in range(n):
            cnt[np.int64((keys[j] >> sh) & np.uint64(0xFFFF)) + 1] += 1
        if cnt.max() < n:  # skip a pass whose digit is the same everywhere
            for d in range(1, 65537):
                cnt[d] += cnt[d - 1]
            for j in range(n):
                digit = np.int64((keys[j] >> sh) & np.uint64(0xFFFF))
                p = cnt[digit]
                tmp_k[p] = keys[j]
                tmp_i[p] = idx[j]
                cnt[digit] = p + 1
            keys, tmp_k = tmp_k, keys
            idx, tmp_i = tmp_i, idx
        shift += 16
    return keys, idx


@njit(cache=True, nogil=True)
def _sort_group(sa, a, b, keys):
    """Sort sa[a:b] by keys[a:b] (in place, both)."""
    g = b - a
    if g <= 24:
        for i in range(a + 1, b):
            kv = keys[i]
            sv = sa[i]
            j = i - 1
            while j >= a and keys[j] > kv:
                keys[j + 1] = keys[j]
                sa[j + 1] = sa[j]
                j -= 1
            keys[j + 1] = kv
            sa[j + 1] = sv
    else:
        perm = np.argsort(keys[a:b])
        ks = keys[a:b][perm]
        ss = sa[a:b][perm]
        keys[a:b] = ks
        sa[a:b] = ss


@njit(cache=True, nogil=True)
def build_sa(text):
    """Starts of all non-SEP positions of ``text`` [n] int32 (ends with SEP), sorted by their first
    KEY_DEPTH tokens (a string ends at its first SEP: what follows a SEP never orders anything).

    Multikey radix: every position gets a key packing its next k tokens (k = 64 // bits per token);
    one LSD radix sort orders all of them; then each group of equal keys that has not hit a SEP is
    re-sorted by the next k tokens, and so on down to KEY_DEPTH. Natural text leaves few and small
    groups after the first k tokens (copied spans), so this is about four sequential-ish passes.
    Tokens must be < 2**21 - 1 (larger ids are remapped to dense ranks by the caller)."""
    n = text.shape[0]
    if n == 0:
        return np.empty(0, np.int32)
    maxv = 0
    for i in range(n):
        if text[i] > maxv:
            maxv = text[i]
    bits = 1
    while (1 << bits) <= maxv + 1:
        bits += 1
    k = 64 // bits
    keys = np.empty(n, np.uint64)
    ended = np.empty(n, np.bool_)
    sh = np.uint64(bits)
    for i in range(n):  # _key(text, i, k, bits), written out: this loop runs once per token
        key = np.uint64(0)
        end = False
        for t in range(k):
            v = 0
            if not end:
                if i + t < n and text[i + t] >= 0:
                    v = text[i + t] + 1
                else:
                    end = True
            key = (key << sh) | np.uint64(v)
        keys[i] = key
        ended[i] = end
    idx = np.arange(n).astype(np.int32)
    keys, sa = _radix_sort(keys, idx, np.empty(n, np.uint64), np.empty(n, np.int32), k * bits)
    # Refine groups of equal keys that may still differ (no SEP inside the key, depth left).
    stack = np.empty((64, 3), np.int64)
    top = 0
    j = 0
    while j < n:
        e = j + 1
        while e < n and keys[e] == keys[j]:
            e += 1
        if e - j > 1 and not ended[sa[j]] and k < KEY_DEPTH:
            if top == stack.shape[0]:
                bigger = np.empty((2 * top, 3), np.int64)
                bigger[:top] = stack
                stack = bigger
            stack[top, 0] = j
            stack[top, 1] = e
            stack[top, 2] = k
            top += 1
        j = e
    while top > 0:
        top -= 1
        a = stack[top, 0]
        b = stack[top, 1]
        d = stack[top, 2]
        kk = min(k, KEY_DEPTH - d)
        for q in range(a, b):
            keys[q], _ = _key(text, sa[q] + d, kk, bits)
        _sort_group(sa, a, b, keys)
        j = a
        while j < b:
            e = j + 1
            while e < b and keys[e] == keys[j]:
                e += 1
            if e - j > 1 and d + kk < KEY_DEPTH:
                _, end = _key(text, sa[j] + d, kk, bits)
                if not end:
                    if top == stack.shape[0]:
                        bigger = np.empty((2 * top, 3), np.int64)
                        bigger[:top] = stack
                        stack = bigger
                    stack[top, 0] = j
                    stack[top, 1] = e
                    stack[top, 2] = d + kk
                    top += 1
            j = e
    # SEP positions have key 0: they sort first. Drop them.
    m = 0
    while m < n and text[sa[m]] < 0:
        m += 1
    return sa[m:].copy()


@njit(cache=True, nogil=True)
def sa_range(text, t0, tn, sa, s0, sn, pat, p0, plen):
    """[lo, hi) (local to sa[s0 : s0 + sn]) of the suffixes starting with pat[p0 : p0 + plen]; the
    segment's text is text[t0 : t0 + tn] (SEP past it). The comparison is written out in each loop:
    a helper taking the arrays would pay an incref/decref per call (see ``tree.py``)."""
    lo = 0
    hi = sn
    while lo < hi:
        mid = (lo + hi) >> 1
        p = sa[s0 + mid]
        c = 0
        for t in range(plen):
            a = text[t0 + p + t] if p + t < tn else -1
            b = pat[p0 + t]
            if a != b:
                c = -1 if a < b else 1
                break
        if c < 0:
            lo = mid + 1
        elif c > 0:
            hi = mid
        else:
            a_lo = lo  # lower bound in [lo, mid]: first entry not < pattern
            a_hi = mid
            while a_lo < a_hi:
                m2 = (a_lo + a_hi) >> 1
                p = sa[s0 + m2]
                less = False
                for t in range(plen):
                    x = text[t0 + p + t] if p + t < tn else -1
                    y = pat[p0 + t]
                    if x != y:
                        less = x < y
                        break
                if less:
                    a_lo = m2 + 1
                else:
                    a_hi = m2
            b_lo = mid + 1  # upper bound in (mid, hi]: first entry > pattern
            b_hi = hi
            while b_lo < b_hi:
                m2 = (b_lo + b_hi) >> 1
                p = sa[s0 + m2]
                greater = False
                for t in range(plen):
                    x = text[t0 + p + t] if p + t < tn else -1
                    y = pat[p0 + t]
                    if x != y:
                        greater = x > y
                        break
                if greater:
                    b_hi = m2
                else:
                    b_lo = m2 + 1
            return a_lo, b_lo
    return lo, lo


@njit(cache=True, nogil=True)
def filter_sa(sa, dead):
    """Drop the starts whose position is marked in ``dead`` [n] bool (deleted documents)."""
    m = 0
    for j in range(sa.shape[0]):
        if not dead[sa[j]]:
            m += 1
    out = np.empty(m, np.int32)
    m = 0
    for j in range(sa.shape[0]):
        if not dead[sa[j]]:
            out[m] = sa[j]
            m += 1
    return out


@njit(cache=True, nogil=True)
def validate_sa(text, sa, live):
    """0 if ``sa`` holds exactly the positions with ``live`` [n] bool set, each once, sorted by their
    first KEY_DEPTH tokens, and ``text`` is well formed; otherwise an error code > 0. Every index is
    range-checked before use: the input is untrusted."""
    n = text.shape[0]
    if n == 0:
        return 0 if sa.shape[0] == 0 else 1
    if text[n - 1] != -1:
        return 2
    for i in range(n):
        if text[i] < -1:
            return 3
        if live[i] and text[i] < 0:
            return 4
    seen = np.zeros(n, np.bool_)
    for j in range(sa.shape[0]):
        s = sa[j]
        if s < 0 or s >= n:
            return 5
        if not live[s] or seen[s]:
            return 6
        seen[s] = True
    for i in range(n):
        if live[i] and not seen[i]:
            return 7
    for j in range(1, sa.shape[0]):
        a = sa[j - 1]
        b = sa[j]
        for t in range(KEY_DEPTH):
            x = text[a + t] if a + t < n else -1
            y = text[b + t] if b + t < n else -1
            if x < y:
                break
            if x > y:
                return 8
            if x == -1:
                break
    return 0
