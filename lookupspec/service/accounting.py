"""The ``usage`` and ``speculation`` objects a finished job reports, the same from both front ends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lookupspec.stats import RequestStats, speculation_dict

from .jobs import ChoiceFinished

__all__ = ["speculation", "usage"]


def speculation(stats: Sequence[RequestStats]) -> dict[str, Any]:
    """The response's ``speculation`` object: the choices' statistics summed."""
    return speculation_dict(*stats)


def usage(prompt_tokens: int, finished: Sequence[ChoiceFinished]) -> dict[str, Any]:
    """OpenAI's ``usage``: ``prompt_tokens_details.cached_tokens`` counts the prompt tokens whose KV
    came from the prefix cache (a prompt's choices share its prefill, so each prompt counts once)."""
    completion = sum(f.completion_tokens for f in finished)
    cached = sum(f.stats.cached_tokens for f in finished)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion, "prompt_tokens_details": {"cached_tokens": cached}}
