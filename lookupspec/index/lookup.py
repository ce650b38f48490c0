"""The lookup contract every token store implements: ``store.lookup(tail, cfg) -> Continuations``.

Given the *tail* (the last tokens of the sequence being decoded), a store finds the **longest suffix
match**: the largest ``L`` in ``[cfg.min_match, cfg.max_match]`` such that ``tail[-L:]`` occurs in the
store followed by at least one more token (an occurrence with nothing after it -- the end of a
document, or the tail itself at the end of a context -- predicts nothing and is ignored). The
*occurrences* of that suffix are the evidence; what follows them is the **continuation tree**.

Tree semantics. A node is a token string ``u`` (1 <= len(u) <= max_depth) that follows the matched
suffix in at least one occurrence; its ``count`` is the number of occurrences followed by ``u`` and its
``last_seen`` the store position of the last token of ``u`` in the most recent such occurrence
(positions grow with insertion order, so larger means more recent).

Ranking and tie-breaking (tested):

- Among siblings, children are ranked by ``count`` desc, then ``last_seen`` desc, then token id asc
  (the last key never decides: two siblings never share a position). Only the first ``width``
  children of a node are eligible.
- Nodes are emitted best-first: a priority queue starts with the eligible children of the root and,
  each time a node is emitted, receives the node's eligible children (if ``depth < max_depth``). The
  queue orders by ``count`` desc, then ``last_seen`` desc, then ``depth`` asc, then token id asc, and
  emission stops after ``max_nodes`` nodes. ``count / num_occurrences`` is the empirical probability
  of the whole path, so this keeps the most likely paths; a parent is always emitted before its
  children (topological order).

Worked example: store ``a b c a b d a b c``, tail ``x a b``, min_match 1, max_match 3. ``x a b`` does
not occur, ``a b`` does, at three places followed by ``c a b ...``, ``d a b ...``, ``c`` (the last
one at the end of the text). Result: match_len 2, num_occurrences 3, root children ``c`` (count 2,
last_seen 8) then ``d`` (count 1); under ``c``: ``a`` (count 1: the second ``c`` ends the text).

Evidence (what keeps every lookup O(1) in the store size): the tree is built from at most
``max_occurrences`` occurrences of the matched suffix, and ``counts`` / ``num_occurrences`` count
among those. The context index takes the most recent ones (see ``context.py``); the suffix-array
stores take all of them when there are few enough, else ``max_occurrences`` evenly spaced ones in
suffix-array order, which is sorted by what follows the match: a sample stratified by continuation,
so every continuation holding more than ``1 / max_occurrences`` of the occurrences is represented
in proportion. With fewer occurrences than that, every count is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = [
    "KEY_DEPTH",
    "SEP",
    "Continuations",
    "LookupConfig",
    "TokenIndex",
    "as_tokens",
    "continuations_from",
    "empty_continuations",
    "tail_array",
]

# Suffix arrays are sorted by their first KEY_DEPTH tokens only (cheaper to build); every comparison a
# lookup makes reads at most max_match + max_depth tokens, which LookupConfig bounds by this.
KEY_DEPTH = 64
# Document separator inside stores; token ids are non-negative, so a pattern never matches across it.
SEP = -1
# Token ids must fit int32 and stay clear of SEP.
_MAX_TOKEN = 2**31 - 1


@dataclass(frozen=True)
class LookupConfig:
    """What one lookup may return. ``max_match + max_depth <= KEY_DEPTH``."""

    min_match: int = 1  # shortest suffix worth drafting from
    max_match: int = 16  # longest suffix tried
    width: int = 3  # distinct next tokens kept per node
    max_depth: int = 16  # tokens drafted past the tail
    max_nodes: int = 32  # nodes in the returned tree
    max_occurrences: int = 32  # occurrences the tree is built from (see module docstring)

    def __post_init__(self) -> None:
        if not 1 <= self.min_match <= self.max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got {self.min_match}, {self.max_match}")
        if not self.max_depth >= 1:
            raise ValueError(f"max_depth must be >= 1, got {self.max_depth}")
        if self.max_match + self.max_depth > KEY_DEPTH:
            raise ValueError(f"max_match + max_depth must be <= {KEY_DEPTH}, got "
                             f"{self.max_match} + {self.max_depth}")
        if not 1 <= self.width <= 64:
            raise ValueError(f"width must be in [1, 64], got {self.width}")
        if not 1 <= self.max_nodes <= 4096:
            raise ValueError(f"max_nodes must be in [1, 4096], got {self.max_nodes}")
        if not 1 <= self.max_occurrences <= 4096:
            raise ValueError(f"max_occurrences must be in [1, 4096], got {self.max_occurrences}")


@dataclass(frozen=True, eq=False)
class Continuations:
    """A longest suffix match and its continuation tree, nodes in topological (emission) order.

    The kernels fill one [5, n] int64 block; the typed per-field arrays are views or casts of it,
    made on first access (a lookup on the decode path pays for none of them)."""

    match_len: int  # 0 = no match (then the tree is empty)
    num_occurrences: int  # occurrences the tree is built from (the root's count)
    data: np.ndarray  # [5, n] int64, rows: token, parent, count, last_seen, depth

    @cached_property
    def tokens(self) -> np.ndarray:  # [n] int32
        return self.data[0].astype(np.int32)

    @cached_property
    def parents(self) -> np.ndarray:  # [n] int32, -1 = child of the tail's last token; parents[i] < i
        return self.data[1].astype(np.int32)

    @property
    def counts(self) -> np.ndarray:  # [n] int64, occurrences supporting the path to the node
        return self.data[2]

    @property
    def last_seen(self) -> np.ndarray:  # [n] int64, position of the node's token, most recent occurrence
        return self.data[3]

    @cached_property
    def depth(self) -> np.ndarray:  # [n] int32, 1 for children of the root
        return self.data[4].astype(np.int32)

    @classmethod
    def from_arrays(cls, match_len: int, num_occurrences: int, tokens: object, parents: object,
                    counts: object, last_seen: object, depth: object) -> Continuations:
        return cls(int(match_len), int(num_occurrences),
                   np.array([tokens, parents, counts, last_seen, depth], np.int64).reshape(5, -1))

    def __len__(self) -> int:
        return int(self.data.shape[1])

    def paths(self) -> dict[tuple[int, ...], tuple[int, int]]:
        """{token path: (count, last_seen)}: an order-free view, handy in tests and debugging."""
        out: dict[tuple[int, ...], tuple[int, int]] = {}
        keys: list[tuple[int, ...]] = []
        tok, par, cnt, last = (r.tolist() for r in self.data[:4])
        for i in range(len(self)):
            p = par[i]
            key = (*(keys[p] if p >= 0 else ()), tok[i])
            keys.append(key)
            out[key] = (cnt[i], last[i])
        return out


def empty_continuations() -> Continuations:
    return Continuations(0, 0, np.empty((5, 0), np.int64))


def as_tokens(tokens: object, what: str = "tokens") -> np.ndarray:
    """Check and convert token ids entering a store: 1-D, integral, in [0, 2**31 - 1] -> int32 array."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, np.int32)
    if arr.dtype == np.int32:
        if int(arr.min()) < 0:
            raise ValueError(f"{what} must be non-negative token ids")
        return np.ascontiguousarray(arr)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must be integer token ids, got dtype {arr.dtype}")
    if int(arr.min()) < 0 or int(arr.max()) > _MAX_TOKEN:
        raise ValueError(f"{what} must be token ids in [0, 2**31 - 1]")
    return arr.astype(np.int32)


def tail_array(tail: object) -> np.ndarray:
    """A lookup's tail as a contiguous 1-D int32 array (the common case passes through untouched).
    Negative ids are allowed here: they never match (the kernels only use the suffix after the last
    negative id), so a lookup cannot be steered across a document boundary."""
    if isinstance(tail, np.ndarray) and tail.dtype == np.int32 and tail.ndim == 1 and tail.flags.c_contiguous:
        return tail
    arr = np.asarray(tail)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"tail must be a 1-D array of token ids, got shape {arr.shape}, dtype {arr.dtype}")
    return np.ascontiguousarray(np.clip(arr, -1, _MAX_TOKEN), dtype=np.int32)


def continuations_from(out: np.ndarray, at: int, match_len: int, n: int,
                       num_occurrences: int) -> Continuations:
    """``Continuations`` owning a copy of the columns ``at:at + n`` of a kernel's ``out`` [5, cap]
    int64 buffer (rows: token, parent, count, last_seen, depth)."""
    if match_len == 0 or n == 0:
        return empty_continuations()
    return Continuations(int(match_len), int(num_occurrences), out[:, at:at + n].copy())


@runtime_checkable
class TokenIndex(Protocol):
    """What every store offers the drafters. ``lookup_into`` is the allocation-free form the composer
    uses each decode step: it writes the tree to ``out`` [5, >= at + cfg.max_nodes] int64 (rows: token,
    parent, count, last_seen, depth) and returns (match_len, nodes, num_occurrences)."""

    def lookup(self, tail: np.ndarray, cfg: LookupConfig) -> Continuations: ...  # tail: [t] int32

    def lookup_into(self, tail: np.ndarray, cfg: LookupConfig, out: np.ndarray,
                    at: int) -> tuple[int, int, int]: ...

    def to_bytes(self) -> bytes: ...
