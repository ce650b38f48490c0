"""Acceptance statistics of one draft source, per match length; they calibrate the source's scores.

A draft node is *tested* when its parent was accepted (or it is a child of the root): only then did
the target model get to judge it. For tested nodes we accumulate, per match length ``L`` (clipped to
``max_match``): how many were tested, how many accepted, and the sum of what the source *predicted*
(its uncalibrated P(accepted | parent accepted)). The calibration factor is

    pooled   = (accepted_all + prior) / (predicted_all + prior)
    factor_L = (accepted_L + prior * pooled) / (predicted_L + prior)

i.e. observed over predicted acceptance, shrunk towards the source's pooled ratio when a match length
has few observations, and towards 1 (trust the counts) before anything is observed.

Depth. Once a copied span is being accepted it tends to go on being accepted: a node deep in a chain
(its parent accepted) is accepted far more often than the first token after a match, for the same
count-based prediction. So the statistics are also kept per (match length, depth), depth = position
past the tail clipped to ``depth_buckets``, and the factor a node gets is

    ratio_d   = ((accepted_d + prior * pooled) / (predicted_d + prior)) / pooled   # depth, all lengths
    factor_Ld = (accepted_Ld + prior * factor_L * ratio_d) / (predicted_Ld + prior)

shrunk towards the per-length factor times the depth's pooled ratio. ``factor(L)`` is the per-length
factor above; ``factors(L)`` the row over depths that scoring uses.

Worked example: a lookup predicted 0.5 for 10 tested nodes at L = 8 and 9 were accepted; with prior 2
and nothing else observed, pooled = 11 / 7 = 1.57 and factor_8 = (9 + 3.14) / (5 + 2) = 1.73, so the
next prediction of 0.5 at L = 8 becomes 0.87.

One object per source can be shared by every request of the process (``observe`` takes a lock).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

__all__ = ["AcceptanceStats"]


@dataclass(eq=False)
class AcceptanceStats:
    max_match: int = 64
    prior: float = 2.0  # pseudo-observations behind the shrinkage
    depth_buckets: int = 8  # depths past this share one bucket
    # [max_match + 1, depth_buckets + 1]: tested nodes, accepted nodes, sum of predictions (index 0 of
    # the depth axis unused)
    tested_ld: np.ndarray = field(init=False)
    accepted_ld: np.ndarray = field(init=False)
    predicted_ld: np.ndarray = field(init=False)
    _lock: threading.Lock = field(init=False, repr=False)
    _factor: np.ndarray = field(init=False, repr=False)
    _table: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_match < 1 or self.prior <= 0 or self.depth_buckets < 1:
            raise ValueError("max_match and depth_buckets must be >= 1 and prior > 0")
        shape = (self.max_match + 1, self.depth_buckets + 1)
        self.tested_ld = np.zeros(shape, np.int64)
        self.accepted_ld = np.zeros(shape, np.int64)
        self.predicted_ld = np.zeros(shape, np.float64)
        self._lock = threading.Lock()
        self._factor = np.ones(self.max_match + 1, np.float32)
        self._table = np.ones(shape, np.float32)

    @property
    def tested(self) -> np.ndarray:
        """[max_match + 1] tested nodes per match length (all depths)."""
        return self.tested_ld.sum(axis=1)

    @property
    def accepted(self) -> np.ndarray:
        return self.accepted_ld.sum(axis=1)

    @property
    def predicted(self) -> np.ndarray:
        return self.predicted_ld.sum(axis=1)

    def observe(self, match_len: object, predicted: object, accepted: object, depth: object = None) -> None:
        """Record tested nodes: match_len [k] int, predicted [k] float, accepted [k] bool, depth [k] int
        (1 = first token past the tail; None: all 1)."""
        L = np.clip(np.asarray(match_len, np.int64).reshape(-1), 0, self.max_match)
        p = np.asarray(predicted, np.float64).reshape(-1)
        a = np.asarray(accepted, np.bool_).reshape(-1)
        d = (np.ones_like(L) if depth is None
             else np.clip(np.asarray(depth, np.int64).reshape(-1), 1, self.depth_buckets))
        if not L.shape == p.shape == a.shape == d.shape:
            raise ValueError(f"observe: shapes differ: {L.shape}, {p.shape}, {a.shape}, {d.shape}")
        if L.size == 0:
            return
        with self._lock:
            np.add.at(self.tested_ld, (L, d), 1)
            np.add.at(self.accepted_ld, (L, d), a.astype(np.int64))
            np.add.at(self.predicted_ld, (L, d), p)
            acc_l, pred_l = self.accepted_ld.sum(axis=1), self.predicted_ld.sum(axis=1)
            pooled = (acc_l.sum() + self.prior) / (pred_l.sum() + self.prior)
            factor = (acc_l + self.prior * pooled) / (pred_l + self.prior)
            acc_d, pred_d = self.accepted_ld.sum(axis=0), self.predicted_ld.sum(axis=0)
            ratio = (acc_d + self.prior * pooled) / (pred_d + self.prior) / pooled
            target = factor[:, None] * ratio[None, :]
            table = (self.accepted_ld + self.prior * target) / (self.predicted_ld + self.prior)
            self._factor = factor.astype(np.float32)
            self._table = table.astype(np.float32)

    def factor(self, match_len: int) -> float:
        """Calibration multiplier for a prediction made at this match length (all depths)."""
        return float(self._factor[min(max(int(match_len), 0), self.max_match)])

    def factors(self, match_len: int) -> np.ndarray:
        """[depth_buckets + 1] float32 multipliers per depth at this match length (index 0 unused;
        depths past the last bucket use the last entry)."""
        return self._table[min(max(int(match_len), 0), self.max_match)]

    def acceptance_rate(self, match_len: int | None = None) -> float:
        """Observed fraction of tested nodes accepted (all lengths when None); nan before any."""
        if match_len is None:
            t, a = self.tested_ld.sum(), self.accepted_ld.sum()
        else:
            i = min(max(int(match_len), 0), self.max_match)
            t, a = self.tested_ld[i].sum(), self.accepted_ld[i].sum()
        return float(a / t) if t else float("nan")
