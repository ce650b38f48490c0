"""The copy oracle: how many tokens per step a perfect lookup drafter could reach on a given output.

Given the prompt and the plain-greedy output, replay decoding. The first output token comes from the
prefill forward (as in :class:`lookupspec.stats.RequestStats`); then every *step* looks at the last
known token, considers every earlier occurrence ``j`` of it in the known context (prompt + output so
far, the last token itself excluded), and proposes the continuation ``context[j + 1 : j + 1 + k]``
that matches the true next tokens for the longest ``k <= max_draft`` (only already known tokens can
be proposed). The step accepts those ``k`` tokens and emits one more (the bonus token), so it emits
``k + 1`` tokens (fewer where the output ends). The oracle value is emitted tokens per step,
``(n - 1) / steps`` for an ``n``-token output: the same quantity as ``RequestStats.acceptance_length``,
so ``acceptance_length / oracle`` says how much of the available copying the drafting captures.

Worked example (prompt ``[7, 8, 9, 5]``, output ``[7, 8, 9, 4]``, tokens per step after the prefill
emitted ``7``):

- step 1: last token 7 occurs at j=0; ``context[1:] = 8, 9, 5`` matches the true ``8, 9, 4`` for k=2,
  so the step emits ``8, 9, 4`` (2 accepted + the bonus 4): 3 tokens, the output is complete.
- oracle = (4 - 1) / 1 = 3.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["OracleResult", "copy_length", "copy_oracle", "copy_oracle_reference"]

MAX_DRAFT = 16


@dataclass(frozen=True)
class OracleResult:
    """``value`` is tokens per step (``None`` when the output has fewer than 2 tokens: no step ran);
    ``steps`` the decode steps the oracle needs; ``target_forwards`` those steps plus the prefill."""

    value: float | None
    steps: int
    new_tokens: int

    @property
    def target_forwards(self) -> int:
        return self.steps + 1 if self.new_tokens else 0


def copy_oracle(prompt_ids: Sequence[int], output_ids: Sequence[int],
                max_draft: int = MAX_DRAFT) -> OracleResult:
    """Copy oracle of ``output_ids`` (the plain-greedy output) after ``prompt_ids``; see the module
    docstring. Vectorised over the earlier occurrences of each step's last token: O(steps x
    occurrences x max_draft) NumPy work, milliseconds for a 2k-token context."""
    if max_draft < 0:
        raise ValueError(f"max_draft must be >= 0, got {max_draft}")
    seq = np.asarray([*prompt_ids, *output_ids], dtype=np.int64)  # [p + n]
    p, n = len(prompt_ids), len(output_ids)
    if n < 2:
        return OracleResult(None, 0, n)
    t, steps = 1, 0  # output tokens known (the first came from the prefill), decode steps so far
    while t < n:
        # a draft longer than the rest of the output cannot be accepted
        k = copy_length(seq, p + t, min(max_draft, n - t))
        t += min(k + 1, n - t)
        steps += 1
    return OracleResult((n - 1) / steps, steps, n)


def copy_length(seq: np.ndarray, known: int, want: int) -> int:
    """One oracle step: how many of the true next tokens ``seq[known : known + want]`` (``want`` at
    most what ``seq`` holds past ``known``) a copy from the context ``seq[:known]`` spells, at best.
    A copy starts after an earlier occurrence of the last known token and takes only known tokens."""
    occurrences = np.flatnonzero(seq[: known - 1] == seq[known - 1])  # [m]
    if not occurrences.size or want <= 0:
        return 0
    idx = occurrences[:, None] + np.arange(1, want + 1)[None, :]  # [m, want] positions a draft would copy
    proposable = idx < known  # only tokens already in the context can be proposed
    drafted = seq[np.minimum(idx, known - 1)]
    match = proposable & (drafted == seq[known : known + want][None, :])
    return int(np.logical_and.accumulate(match, axis=1).sum(axis=1).max())


def copy_oracle_reference(prompt_ids: Sequence[int], output_ids: Sequence[int],
                          max_draft: int = MAX_DRAFT) -> OracleResult:
    """Plain-Python twin of :func:`copy_oracle` (quadratic; for tests)."""
    seq = [*prompt_ids, *output_ids]
    p, n = len(prompt_ids), len(output_ids)
    if n < 2:
        return OracleResult(None, 0, n)
    t, steps = 1, 0
    while t < n:
        known = p + t
        best = 0
        for j in range(known - 1):
            if seq[j] != seq[known - 1]:
                continue
            k = 0
            while (k < max_draft and t + k < n and j + 1 + k < known
                   and seq[j + 1 + k] == seq[known + k]):
                k += 1
            best = max(best, k)
        t += min(best + 1, n - t)
        steps += 1
    return OracleResult((n - 1) / steps, steps, n)
