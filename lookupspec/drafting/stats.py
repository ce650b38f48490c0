"""Acceptance statistics of one draft source, per match length; they calibrate the source's scores.

A draft node is *tested* when its parent was accepted (or it is a child of the root): only then did
the target model get to judge it. For tested nodes we accumulate, per match length ``L`` (clipped to
``max_match``): how many were tested, how many accepted, and the sum of what the source *predicted*
(its uncalibrated P(accepted | parent accepted)). The calibration factor is

    pooled   = (accepted_all + prior) / (predicted_all + prior)
    factor_L = (accepted_L + prior * pooled) / (predicted_L + prior)

i.e. observed over predicted acceptance, shrunk towards the source's pooled ratio when a match length
has few observations, and towards 1 (trust the counts) before anything is observed.

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
    tested: np.ndarray = field(init=False)  # [max_match + 1] int64, indexed by match length
    accepted: np.ndarray = field(init=False)  # [max_match + 1] int64
    predicted: np.ndarray = field(init=False)  # [max_match + 1] float64, sum of predictions
    _lock: threading.Lock = field(init=False, repr=False)
    _factor: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_match < 1 or self.prior <= 0:
            raise ValueError("max_match must be >= 1 and prior > 0")
        self.tested = np.zeros(self.max_match + 1, np.int64)
        self.accepted = np.zeros(self.max_match + 1, np.int64)
        self.predicted = np.zeros(self.max_match + 1, np.float64)
        self._lock = threading.Lock()
        self._factor = np.ones(self.max_match + 1, np.float32)

    def observe(self, match_len: object, predicted: object, accepted: object) -> None:
        """Record tested nodes: match_len [k] int, predicted [k] float, accepted [k] bool."""
        L = np.clip(np.asarray(match_len, np.int64).reshape(-1), 0, self.max_match)
        p = np.asarray(predicted, np.float64).reshape(-1)
        a = np.asarray(accepted, np.bool_).reshape(-1)
        if not L.shape == p.shape == a.shape:
            raise ValueError(f"observe: shapes differ: {L.shape}, {p.shape}, {a.shape}")
        if L.size == 0:
            return
        with self._lock:
            np.add.at(self.tested, L, 1)
            np.add.at(self.accepted, L, a.astype(np.int64))
            np.add.at(self.predicted, L, p)
            pooled = (self.accepted.sum() + self.prior) / (self.predicted.sum() + self.prior)
            factor = (self.accepted + self.prior * pooled) / (self.predicted + self.prior)
            self._factor = factor.astype(np.float32)

    def factor(self, match_len: int) -> float:
        """Calibration multiplier for a prediction made at this match length."""
        return float(self._factor[min(max(int(match_len), 0), self.max_match)])

    def acceptance_rate(self, match_len: int | None = None) -> float:
        """Observed fraction of tested nodes accepted (all lengths when None); nan before any."""
        if match_len is None:
            t, a = self.tested.sum(), self.accepted.sum()
        else:
            i = min(max(int(match_len), 0), self.max_match)
            t, a = self.tested[i], self.accepted[i]
        return float(a / t) if t else float("nan")
