"""Speculation statistics, per request and aggregated, in the vocabulary of ``lookupspec.verify``.

A *step* is one target forward after the prefill. Each step has ``draft`` tokens proposed (0 for a
plain step) of which ``accepted`` were accepted, and always emits one more token (recovered or bonus),
so its *acceptance length* is ``accepted + 1``. ``accepted_per_position[i]`` counts steps whose
accepted run reached draft position i (0-based), which is what vLLM's per-position counter reports.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SPECULATION_KEYS", "AggregateStats", "RequestStats", "speculation_dict"]

# The statistics clients see (the gateway's ``speculation`` object, the integrations' metadata).
SPECULATION_KEYS = ("steps", "draft_steps", "draft_tokens", "accepted_tokens", "acceptance_length",
                    "accepted_per_position", "draft_tokens_by_source", "accepted_tokens_by_source",
                    "source_shares")


@dataclass
class RequestStats:
    steps: int = 0
    draft_steps: int = 0  # steps that verified at least one draft token
    draft_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    draft_tokens_by_source: dict[str, int] = field(default_factory=dict)
    accepted_tokens_by_source: dict[str, int] = field(default_factory=dict)
    prefill_s: float = 0.0
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (not prefilled)
    draft_s: float = 0.0
    verify_s: float = 0.0  # target forward + acceptance walk + KV bookkeeping

    @property
    def target_forwards(self) -> int:
        """Target model forwards including the prefill."""
        return self.steps + 1

    @property
    def acceptance_length(self) -> float:
        """Mean tokens per step (accepted + 1); 1.0 for plain decoding."""
        return (self.accepted_tokens + self.steps) / self.steps if self.steps else 0.0

    def observe(self, *, draft: int, accepted: int, emitted: int, source_draft: dict[str, int] | None = None,
                source_accepted: dict[str, int] | None = None, draft_s: float = 0.0,
                verify_s: float = 0.0) -> None:
        """Record one step."""
        self.steps += 1
        self.draft_steps += draft > 0
        self.draft_tokens += draft
        self.accepted_tokens += accepted
        self.emitted_tokens += emitted
        if accepted > len(self.accepted_per_position):
            self.accepted_per_position.extend([0] * (accepted - len(self.accepted_per_position)))
        for i in range(accepted):
            self.accepted_per_position[i] += 1
        for name, n in (source_draft or {}).items():
            self.draft_tokens_by_source[name] = self.draft_tokens_by_source.get(name, 0) + n
        for name, n in (source_accepted or {}).items():
            self.accepted_tokens_by_source[name] = self.accepted_tokens_by_source.get(name, 0) + n
        self.draft_s += draft_s
        self.verify_s += verify_s

    def source_shares(self) -> dict[str, float]:
        """Share of accepted draft tokens that came from each source."""
        total = sum(self.accepted_tokens_by_source.values())
        return {k: v / total for k, v in sorted(self.accepted_tokens_by_source.items())} if total else {}

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "target_forwards": self.target_forwards,
            "draft_steps": self.draft_steps,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "emitted_tokens": self.emitted_tokens,
            "acceptance_length": round(self.acceptance_length, 4),
            "accepted_per_position": list(self.accepted_per_position),
            "draft_tokens_by_source": dict(self.draft_tokens_by_source),
            "accepted_tokens_by_source": dict(self.accepted_tokens_by_source),
            "source_shares": {k: round(v, 4) for k, v in self.source_shares().items()},
            "prefill_s": round(self.prefill_s, 6),
            "cached_tokens": self.cached_tokens,
            "draft_s": round(self.draft_s, 6),
            "verify_s": round(self.verify_s, 6),
        }


class AggregateStats:
    """Process-wide totals (thread-safe): what /metrics and `generate -v` report."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.total = RequestStats()

    def add(self, r: RequestStats) -> None:
        with self._lock:
            self.requests += 1
            t = self.total
            t.steps += r.steps
            t.draft_steps += r.draft_steps
            t.draft_tokens += r.draft_tokens
            t.accepted_tokens += r.accepted_tokens
            t.emitted_tokens += r.emitted_tokens
            grow = len(r.accepted_per_position) - len(t.accepted_per_position)
            t.accepted_per_position.extend([0] * max(grow, 0))
            for i, n in enumerate(r.accepted_per_position):
                t.accepted_per_position[i] += n
            for src, dst in ((r.draft_tokens_by_source, t.draft_tokens_by_source),
                             (r.accepted_tokens_by_source, t.accepted_tokens_by_source)):
                for k, v in src.items():
                    dst[k] = dst.get(k, 0) + v
            t.prefill_s += r.prefill_s
            t.cached_tokens += r.cached_tokens
            t.draft_s += r.draft_s
            t.verify_s += r.verify_s

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": self.requests, **self.total.as_dict()}


def speculation_dict(*stats: RequestStats) -> dict[str, Any]:
    """The statistics of one or more requests, summed, as clients see them (``SPECULATION_KEYS``)."""
    agg = AggregateStats()
    for s in stats:
        agg.add(s)
    d = agg.total.as_dict()
    return {k: d[k] for k in SPECULATION_KEYS}
