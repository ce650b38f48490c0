"""Acceptance learning: how the drafting policy's scores and gates follow observed acceptance.

:class:`ScoreCalibration` maps a draft node's path score to the observed chance that it is accepted;
:class:`Exploration` verifies refused lookup trees now and then so their sources can recover;
:class:`DraftModelGate` keeps the draft model's acceptance per chain position and probes it when
closed. The costs these are weighed against live in :mod:`lookupspec.cost`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

__all__ = ["DraftModelGate", "Exploration", "ScoreCalibration"]


class ScoreCalibration:
    """Maps a draft node's path score to the observed chance that it ends up on the accepted path.

    The drafters' scores are products of per-node conditionals, each calibrated by match length and
    depth; their product still comes out too low for the many deep, low-scoring nodes of long copies
    (measured on the bench prompts: nodes scored 0.03 were accepted 7% of the time, 0.14 -> 22%).
    Since the policy's expected gain is the sum of these probabilities, an under-estimate verifies too
    few nodes. This keeps, per score bin ``b`` (center ``c_b``), how many verified nodes were accepted
    (decayed), estimates the bin's acceptance as

        p_b = (accepted_b + prior * c_b) / (verified_b + prior)     # made non-decreasing over bins

    and returns ``calibrated(s) = s * p_b / c_b`` for a score ``s`` in bin ``b`` (capped at 1, then a
    running minimum so that descending input stays descending: the prefix-closed tree order is kept).
    Thread-safe; one per engine, shared by its requests."""

    def __init__(self, bins: int = 20, prior: float = 8.0, decay: float = 0.999) -> None:
        self.bins = bins
        self.prior = prior
        self.decay = decay  # old evidence fades: acceptance drifts with the workload
        self.verified = np.zeros(bins)
        self.accepted = np.zeros(bins)
        self._lock = threading.Lock()
        centers = (np.arange(bins) + 0.5) / bins
        self._ratio = np.ones(bins)  # calibrated / center, per bin
        self._centers = centers

    def _bin(self, scores: np.ndarray) -> np.ndarray:
        return np.minimum((np.clip(scores, 0.0, 1.0) * self.bins).astype(np.int64), self.bins - 1)

    def observe(self, scores: np.ndarray, accepted: np.ndarray) -> None:
        """scores [n] the verified nodes' raw path scores; accepted [n] bool, node on the accepted path."""
        if len(scores) == 0:
            return
        b = self._bin(np.asarray(scores, np.float64))
        with self._lock:
            self.verified *= self.decay
            self.accepted *= self.decay
            np.add.at(self.verified, b, 1.0)
            np.add.at(self.accepted, b, np.asarray(accepted, np.float64))
            cal = (self.accepted + self.prior * self._centers) / (self.verified + self.prior)
            cal = np.maximum.accumulate(np.minimum(cal, 1.0))
            self._ratio = cal / self._centers

    def observe_path(self, scores: np.ndarray, accepted: Sequence[int]) -> None:
        """scores [n] of a verified tree's nodes; accepted: indices of the nodes on the accepted path."""
        on_path = np.zeros(len(scores), dtype=bool)
        on_path[list(accepted)] = True
        self.observe(np.asarray(scores, np.float64), on_path)

    def apply(self, scores: np.ndarray) -> np.ndarray:
        """Calibrated scores [n] (same order as ``scores`` when those are sorted descending)."""
        s = np.asarray(scores, np.float64)
        if s.size == 0:
            return s
        out = np.minimum(s * self._ratio[self._bin(s)], 1.0)
        return np.minimum.accumulate(out)  # descending input stays descending


class Exploration:
    """Verifies the top lookup nodes anyway after ``every`` steps in a row whose non-empty tree the
    policy refused. The scores are calibrated by observed acceptance, and a source that is never
    verified never gets the evidence to recover (a bad first request would switch lookups off for
    good); ``nodes`` extra nodes in a forward cost a few percent of a step on the machines measured.
    One per engine: the count runs across its requests, and across the sequences of a batch, which
    share the calibration: a step explores at most one sequence (``adjust_batch``), so the rows it
    adds do not grow with the batch."""

    def __init__(self, every: int = 8, nodes: int = 2) -> None:
        self.every = every
        self.nodes = nodes
        self._refused = 0
        self._turn = 0  # which of a batch's refused sequences explores next (round robin)

    def adjust_batch(self, keep: Sequence[int], available: Sequence[int]) -> list[int]:
        """Node counts for one step: ``keep[i]`` the policy's choice for sequence i, ``available[i]`` its
        lookup tree's nodes (0 for a sequence with no tree or drafting a draft-model chain). A step
        that verifies some tree resets the count; a step that refuses every non-empty tree counts once,
        and every ``every``-th such step one of them (in turn) verifies ``nodes`` nodes."""
        out = list(keep)
        if any(k for k, a in zip(keep, available, strict=True) if a):
            self._refused = 0
            return out
        refused = [i for i, a in enumerate(available) if a]
        if not refused:
            return out
        self._refused += 1
        if self._refused < self.every:
            return out
        self._refused = 0
        i = refused[self._turn % len(refused)]
        self._turn += 1
        out[i] = min(available[i], self.nodes)
        return out

    def adjust(self, k: int, available: int) -> int:
        """The node count to verify for a step of one sequence, given the policy's choice ``k`` out of
        ``available`` nodes."""
        return self.adjust_batch([k], [available])[0]


class DraftModelGate:
    """Acceptance history of the draft model per chain position, and whether drafting with it pays.

    ``rates()`` estimates P(position i accepted | position i - 1 accepted) with a Beta(1, 1) prior.
    When the policy keeps choosing zero draft-model tokens the gate closes, but every ``probe_every``
    steps it lets a short chain through so the estimate can recover when the text starts to copy
    (the draft model "switches back on when it would pay")."""

    def __init__(self, max_len: int = 16, probe_every: int = 32, probe_len: int = 2) -> None:
        self.max_len = max_len
        self.probe_every = probe_every
        self.probe_len = probe_len
        self.tried = np.zeros(max_len)
        self.accepted = np.zeros(max_len)
        self.steps_since_use = probe_every  # probe on the first chance: there is no history yet
        self._lock = threading.Lock()

    def rates(self) -> np.ndarray:
        with self._lock:
            return (self.accepted + 1.0) / (self.tried + 2.0)

    def path_scores(self, k: int) -> np.ndarray:
        return np.cumprod(self.rates()[: min(k, self.max_len)])

    def observe(self, drafted: int, accepted: int) -> None:
        with self._lock:
            d = min(drafted, self.max_len)
            a = min(accepted, d)
            self.tried[: min(a + 1, d)] += 1  # positions up to the first rejection were judged
            self.accepted[:a] += 1
            decay = 0.995  # forget slowly: acceptance drifts with the text being written
            self.tried *= decay
            self.accepted *= decay

    def probe_due(self) -> bool:
        return self.steps_since_use >= self.probe_every
