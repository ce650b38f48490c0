"""Plain-Python references of the numba structures, kept for the property tests (slow, obvious).

Each function restates a contract from the module that owns it, with lists and brute force:

- ``ref_suffix_keys`` / ``ref_sa_range``  <- ``suffix_array.build_sa`` / ``sa_range``
- ``ref_prev_chains``                    <- the context index's per-length hash chains
- ``ref_lookup_docs``                    <- ``CorpusIndex`` / ``OutputIndex`` lookups (segments + tree)
- ``ref_lookup_context``                 <- ``ContextIndex.lookup``
- ``ref_expand``                         <- ``tree.expand_tree`` (ranking and emission order)
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from .lookup import KEY_DEPTH, SEP, Continuations, LookupConfig, empty_continuations

__all__ = [
    "ref_expand",
    "ref_lookup_context",
    "ref_lookup_docs",
    "ref_prev_chains",
    "ref_sa_range",
    "ref_suffix_key",
    "ref_suffix_keys",
]

Occurrence = tuple[int, int]  # (document index, end position of the matched suffix in it)


def ref_suffix_key(text: Sequence[int], i: int) -> tuple[int, ...]:
    """The sort key of the suffix at i: its first KEY_DEPTH tokens, cut after the first SEP."""
    key = []
    for t in text[i:i + KEY_DEPTH]:
        key.append(int(t))
        if t == SEP:
            break
    return tuple(key)


def ref_suffix_keys(text: Sequence[int]) -> list[tuple[int, ...]]:
    """Sorted keys of every non-SEP start: what ``build_sa`` must produce."""
    return sorted(ref_suffix_key(text, i) for i in range(len(text)) if text[i] != SEP)


def ref_sa_range(text: Sequence[int], sa: Sequence[int], pattern: Sequence[int]) -> tuple[int, int]:
    """[lo, hi) of the entries of ``sa`` whose suffix starts with ``pattern`` (assumes sorted sa)."""
    p = list(pattern)
    hits = [k for k, s in enumerate(sa) if list(text[s:s + len(p)]) == p]
    return (hits[0], hits[-1] + 1) if hits else (_insertion_point(text, sa, p), _insertion_point(text, sa, p))


def _insertion_point(text: Sequence[int], sa: Sequence[int], p: list[int]) -> int:
    k = 0
    while k < len(sa) and list(text[sa[k]:sa[k] + len(p)]) < p:
        k += 1
    return k


def ref_prev_chains(tokens: Sequence[int], max_ngram: int) -> np.ndarray:
    """[max_ngram, n]: end of the previous occurrence of the L-gram ending at j, or -1."""
    n = len(tokens)
    out = np.full((max_ngram, n), -1, np.int64)
    for L in range(1, max_ngram + 1):
        last: dict[tuple[int, ...], int] = {}
        for j in range(L - 1, n):
            g = tuple(tokens[j - L + 1:j + 1])
            out[L - 1, j] = last.get(g, -1)
            last[g] = j
    return out


def ref_expand(docs: Sequence[Sequence[int]], bases: Sequence[int], occs: Sequence[Occurrence],
               cfg: LookupConfig, match_len: int) -> Continuations:
    """The continuation tree of ``occs`` (ranking and emission rules of ``lookup.py``)."""
    def tok(o: Occurrence, d: int) -> int | None:
        doc, end = o
        p = end + d
        return int(docs[doc][p]) if p < len(docs[doc]) else None

    def children(support: list[Occurrence], d: int) -> list[tuple[int, int, int, list[Occurrence]]]:
        groups: dict[int, list[Occurrence]] = {}
        for o in support:
            t = tok(o, d)
            if t is not None:
                groups.setdefault(t, []).append(o)
        ranked = []
        for t, sup in groups.items():
            last = max(bases[o[0]] + o[1] + d for o in sup)
            ranked.append((len(sup), last, t, sup))
        ranked.sort(key=lambda x: (-x[0], -x[1], x[2]))
        return ranked[:cfg.width]

    root = [o for o in occs if tok(o, 1) is not None]
    heap: list[tuple[int, int, int, int, int, int, list[Occurrence]]] = []
    tie = 0
    for cnt, last, t, sup in children(root, 1):
        heap.append((-cnt, -last, 1, t, tie, -1, sup))
        tie += 1
    heapq.heapify(heap)
    toks: list[int] = []
    pars: list[int] = []
    cnts: list[int] = []
    lasts: list[int] = []
    depths: list[int] = []
    while heap and len(toks) < cfg.max_nodes:
        ncnt, nlast, d, t, _, par, sup = heapq.heappop(heap)
        idx = len(toks)
        toks.append(t)
        pars.append(par)
        cnts.append(-ncnt)
        lasts.append(-nlast)
        depths.append(d)
        if d < cfg.max_depth and len(toks) < cfg.max_nodes:
            for cnt, last, ct, csup in children(sup, d + 1):
                heapq.heappush(heap, (-cnt, -last, d + 1, ct, tie, idx, csup))
                tie += 1
    return Continuations.from_arrays(match_len, len(root), toks, pars, cnts, lasts, depths)


def _occurrences(doc: Sequence[int], pat: list[int]) -> list[int]:
    """End positions of ``pat`` in ``doc`` that are followed by another token."""
    L = len(pat)
    return [e for e in range(L - 1, len(doc) - 1) if list(doc[e - L + 1:e + 1]) == pat]


def ref_lookup_docs(docs: Sequence[Sequence[int]], bases: Sequence[int], tail: Sequence[int],
                    cfg: LookupConfig, segments: Sequence[Sequence[int]] | None = None) -> Continuations:
    """A segment index's lookup: exact longest match over all documents; the evidence is every
    occurrence with a next token, or ``max_occurrences`` of them at the midpoints of equal strata
    of the occurrences in suffix-array order (``segments``: document indices per segment, oldest
    first; default one segment). Entries with equal sort keys continue identically, so the counts
    do not depend on how a suffix array orders ties (``last_seen`` may)."""
    tail = [int(t) for t in tail]
    segments = [list(range(len(docs)))] if segments is None else segments
    for L in range(min(cfg.max_match, len(tail)), cfg.min_match - 1, -1):
        pat = tail[len(tail) - L:]
        occs: list[Occurrence] = []
        for seg in segments:
            found = [(k, e) for k in seg for e in _occurrences(docs[k], pat)]
            found.sort(key=lambda o: ref_suffix_key([*docs[o[0]], SEP], o[1] - L + 1))
            occs += found
        if occs:
            t, k = len(occs), cfg.max_occurrences
            if t > k:
                occs = [occs[((2 * i + 1) * t) // (2 * k)] for i in range(k)]
            return ref_expand(docs, bases, occs, cfg, L)
    return empty_continuations()


def ref_lookup_context(tokens: Sequence[int], tail: Sequence[int], cfg: LookupConfig,
                       max_ngram: int) -> Continuations:
    """The context index's lookup (steps 1-4 of ``context.py``)."""
    tokens = [int(t) for t in tokens]
    tail = [int(t) for t in tail]
    lcap = min(cfg.max_match, len(tail))
    for L in range(min(max_ngram, lcap), 0, -1):
        ends = _occurrences(tokens, tail[len(tail) - L:])
        if ends:
            break
    else:
        return empty_continuations()
    ends = sorted(ends, reverse=True)[:cfg.max_occurrences]
    if max_ngram == L and lcap > max_ngram:
        def ext(e: int) -> int:
            m = L
            while m < lcap and e - m >= 0 and tokens[e - m] == tail[len(tail) - 1 - m]:
                m += 1
            return m
        best = max(ext(e) for e in ends)
        ends = [e for e in ends if ext(e) == best]
        L = best
    if cfg.min_match > L:
        return empty_continuations()
    return ref_expand([tokens], [0], [(0, e) for e in ends], cfg, L)
