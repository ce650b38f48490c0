"""The drafter seam and the data that crosses it: scored candidates in, one draft tree out.

A **drafter** is anything that proposes continuations of the current sequence with an estimate of
how likely the target model is to accept them: the lookups over the context, corpus and output
stores, and (added by the engine) a small draft model. Each proposal is a ``Candidate``: a tree of
draft tokens from one source whose nodes carry

- ``predicted``: the source's own, uncalibrated estimate of P(node accepted | parent accepted), what
  the acceptance statistics calibrate against (for a lookup: count / (parent count + 1));
- ``prob``: that estimate after calibration by the source's observed acceptance;
- ``score``: the product of ``prob`` along the path, the estimated probability that the whole path
  to the node is accepted. It never grows along a path.

The composer (``composer.py``) merges candidates into one ``DraftTree``. Vocabulary (draft, accepted,
recovered, bonus tokens, step, acceptance length) as defined in ``lookupspec.verify``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from lookupspec.params import LookupScope, SpecParams

import numpy as np

__all__ = ["Candidate", "DraftSession", "DraftSessions", "DraftTree", "Drafter", "ProposedTree"]


@dataclass(frozen=True, eq=False)
class Candidate:
    """A scored continuation tree from one source, nodes in topological order."""

    source: str
    match_len: int  # suffix match length that produced it (0 for a draft model)
    tokens: np.ndarray  # [n] int32
    parents: np.ndarray  # [n] int32, -1 = child of the root (the last accepted token); parents[i] < i
    predicted: np.ndarray  # [n] float32, uncalibrated P(accepted | parent accepted)
    prob: np.ndarray  # [n] float32, calibrated P(accepted | parent accepted)
    score: np.ndarray  # [n] float32, P(path to the node accepted)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


@runtime_checkable
class Drafter(Protocol):
    """A source of draft candidates. ``observe`` receives, for every draft node of this source that
    was *tested* (its parent was accepted, or it hung off the root), the match length, the node's
    ``predicted`` value and whether the target accepted it."""

    name: str

    def propose(self, tail: np.ndarray, budget: int) -> list[Candidate]: ...  # tail: [t] int32

    def observe(self, match_len: np.ndarray, predicted: np.ndarray, accepted: np.ndarray,
                depth: np.ndarray | None = None) -> None: ...


@dataclass(frozen=True, eq=False)
class DraftTree:
    """One step's draft tree. Nodes are ordered by ``score`` (desc), so every prefix is a tree and the
    first k nodes are the k nodes with the highest expected contribution to the acceptance length."""

    tokens: np.ndarray  # [n] int32
    parents: np.ndarray  # [n] int32, -1 = root (the last accepted token); parents[i] < i
    source: np.ndarray  # [n] int8, index into source_names
    match_len: np.ndarray  # [n] int32
    score: np.ndarray  # [n] float32, P(path to the node accepted)
    depth: np.ndarray  # [n] int32, 1 for children of the root (position offset past the root)
    predicted: np.ndarray  # [n] float32, what the source predicted (fed back by Composer.observe)
    source_names: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def expected_accepted(self) -> float:
        """Expected number of accepted draft tokens: the sum of the path scores."""
        return float(self.score.sum(dtype=np.float64))

    @property
    def is_chain(self) -> bool:
        return bool(np.all(self.parents == np.arange(-1, len(self) - 1)))

    def prefix(self, k: int) -> DraftTree:
        """The first k nodes (a tree: parents come before children)."""
        k = max(0, min(int(k), len(self)))
        return DraftTree(self.tokens[:k], self.parents[:k], self.source[:k], self.match_len[:k],
                         self.score[:k], self.depth[:k], self.predicted[:k], self.source_names)

    def select(self, keep: Sequence[int] | np.ndarray) -> DraftTree:
        """The nodes ``keep`` (ascending indices; every kept node's parent is kept too), renumbered.
        The order, and so the score order, stays: every prefix is still a tree."""
        tokens, parents, source, score, match_len, depth, predicted = _select(
            self, keep, self.match_len, self.depth, self.predicted)
        return DraftTree(tokens, parents, source, match_len, score, depth, predicted, self.source_names)

    def sources(self) -> list[str]:
        return [self.source_names[int(s)] for s in self.source]

    @classmethod
    def _fast(cls, tokens: np.ndarray, parents: np.ndarray, source: np.ndarray, match_len: np.ndarray,
              score: np.ndarray, depth: np.ndarray, predicted: np.ndarray,
              source_names: tuple[str, ...]) -> DraftTree:
        """The composer's per-step constructor: no checks, and it skips the frozen dataclass's
        field-by-field ``object.__setattr__`` (a few microseconds per step)."""
        tree = object.__new__(cls)
        tree.__dict__.update(tokens=tokens, parents=parents, source=source, match_len=match_len, score=score,
                             depth=depth, predicted=predicted, source_names=source_names)
        return tree

    @classmethod
    def empty(cls, source_names: Sequence[str] = ()) -> DraftTree:
        i32 = np.empty(0, np.int32)
        f32 = np.empty(0, np.float32)
        return cls(i32, i32, np.empty(0, np.int8), i32, f32, i32, f32, tuple(source_names))


def _select(tree: ProposedTree, keep: Sequence[int] | np.ndarray,
            *extra: np.ndarray) -> tuple[np.ndarray, ...]:
    """``tree.select``'s arrays: tokens, parents (renumbered), source, score, then each of ``extra``, at
    the kept nodes. Example: parents [-1, 0, 0, 2], keep [0, 2, 3] -> parents [-1, 0, 1]."""
    idx = np.asarray(keep, np.int64).reshape(-1)
    where = np.full(len(tree.tokens) + 1, -2, np.int64)  # where[old + 1] = new; where[0]: the root
    where[0] = -1
    where[idx + 1] = np.arange(idx.size)
    parents = where[np.asarray(tree.parents, np.int64)[idx] + 1]
    if (parents < -1).any() or (idx.size and (np.diff(idx) <= 0).any()):
        raise ValueError("select takes ascending node indices whose parents are kept")
    arrays = (tree.tokens, tree.source, tree.score, *extra)
    tokens, source, score, *rest = (a[idx] for a in arrays)
    return (tokens, parents.astype(np.asarray(tree.parents).dtype), source, score, *rest)


class ProposedTree(Protocol):
    """What a drafting session proposes each step (``DraftTree`` is the implementation): nodes
    ordered by ``score`` so that ``prefix(k)`` is a tree for every ``k``."""

    @property
    def tokens(self) -> np.ndarray: ...  # [n] int
    @property
    def parents(self) -> np.ndarray: ...  # [n] int, -1 = root
    @property
    def source(self) -> np.ndarray: ...  # [n] index into source_names
    @property
    def score(self) -> np.ndarray: ...  # [n] float, descending
    @property
    def source_names(self) -> tuple[str, ...]: ...

    def prefix(self, k: int) -> ProposedTree: ...

    def select(self, keep: Sequence[int] | np.ndarray) -> ProposedTree: ...  # DraftTree.select


class DraftSession(Protocol):
    """One request's lookup drafting (``drafting.session.LookupSession`` is the implementation): it
    proposes a tree for the current context, follows the tokens the request emits and learns from
    what verification accepted."""

    def propose(self, max_nodes: int, chain_only: bool = False) -> ProposedTree: ...

    def extend(self, tokens: Sequence[int]) -> None: ...

    def feedback(self, tree: ProposedTree, accepted: Sequence[int]) -> None: ...


class DraftSessions(Protocol):
    """Engine-wide lookup drafting: one session per request (``drafting.session.LookupDrafting``)."""

    def session(self, context: Sequence[int], spec: SpecParams,
                scope: LookupScope | None) -> DraftSession: ...
