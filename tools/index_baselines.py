"""The two lookup baselines `python -m tools bench-index` compares against, written for this project.

- ``hf_prompt_lookup``: in the style of Hugging Face ``prompt_lookup_num_tokens``: for n-gram sizes
  from ``max_ngram`` down to 1, a NumPy sliding-window comparison of the context's last n tokens with
  every window of the context; the *earliest* match wins and the tokens after it form one chain.
  Cost: O(context length * n) per step, with NumPy's per-call overheads.
- ``vllm_ngram``: in the style of vLLM's ``ngram`` proposer: one numba KMP pass over the *reversed*
  context (the reversed tail is the pattern, so the failure function gives, for every position, the
  longest suffix of the context ending there), keeping the longest match of at least ``min_n``
  tokens (capped at ``max_n``; the latest position wins ties) and drafting the ``k`` tokens after it.
  Cost: O(context length) per step.

Both return a chain ``[k] int32`` (possibly shorter or empty); they exist to be timed, and to
sanity-check that our stores find matches at least as long.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["hf_prompt_lookup", "vllm_ngram"]


def hf_prompt_lookup(context: np.ndarray, k: int, max_ngram: int = 2) -> np.ndarray:
    """context: [n] int32. The chain of up to k tokens after the earliest match of the last n-gram."""
    n_ctx = context.shape[0]
    for n in range(min(max_ngram, n_ctx - 1), 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)  # excludes the tail itself
        hits = np.flatnonzero((windows == context[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return context[start:min(start + k, n_ctx)].copy()
    return np.empty(0, np.int32)


@njit(cache=True, nogil=True)
def _kmp_longest(context, min_n, max_n):
    """(length, end) of the longest earlier occurrence of a suffix of ``context`` (KMP on the reverse:
    pattern = reversed context, text = reversed context shifted by one)."""
    n = context.shape[0]
    m = min(max_n, n - 1)
    if m < min_n:
        return 0, -1
    # Failure function of the pattern rev[0:m] where rev[i] = context[n - 1 - i].
    fail = np.zeros(m, np.int32)
    k = 0
    for i in range(1, m):
        while k > 0 and context[n - 1 - i] != context[n - 1 - k]:
            k = fail[k - 1]
        if context[n - 1 - i] == context[n - 1 - k]:
            k += 1
        fail[i] = k
    # Scan the text rev[1:] (positions n - 2 down to 0 of the context).
    best = 0
    best_end = -1
    k = 0
    for j in range(n - 2, -1, -1):
        c = context[j]
        while k > 0 and c != context[n - 1 - k]:
            k = fail[k - 1]
        if c == context[n - 1 - k]:
            k += 1
        # k tokens of the reversed tail match ending here: context[j : j + k] equals the last k tokens,
        # so the match ends at j + k - 1 and its continuation starts at j + k.
        if k > best and j + k < n:
            best = k
            best_end = j + k - 1
        if k == m:
            k = fail[k - 1]
    if best < min_n:
        return 0, -1
    return best, best_end


def vllm_ngram(context: np.ndarray, k: int, min_n: int = 1, max_n: int = 4) -> np.ndarray:
    """context: [n] int32. The chain of up to k tokens after the longest suffix match."""
    length, end = _kmp_longest(context, min_n, max_n)
    if length == 0:
        return np.empty(0, np.int32)
    return context[end + 1:min(end + 1 + k, context.shape[0])].copy()
