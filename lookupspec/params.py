"""Per-request generation parameters (token level; text-level stop strings are in ``detokenize``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lookupspec.logits import LogitsParams
from lookupspec.sampling import SamplingParams

__all__ = ["ALL_SOURCES", "LOOKUP_SOURCES", "MAX_DRAFT_TOKENS", "GenerationParams", "LookupScope",
           "SpecParams"]


@dataclass(frozen=True)
class GenerationParams:
    """What ends a generation and how tokens are chosen.

    ``stop_token_ids`` end generation like EOS does (the stop token is emitted, as Hugging Face
    ``generate`` does, so token-level outputs compare equal; the text layer hides special tokens).
    ``eos_token_ids`` are the model's own end tokens, ignored when ``ignore_eos`` is set.
    """

    max_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: tuple[int, ...] = ()
    eos_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # grammar, penalties, logit bias, min_tokens, log-probabilities (lookupspec.logits)
    logits: LogitsParams = field(default_factory=LogitsParams)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.logits.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.logits.min_tokens}) must not exceed max_tokens "
                             f"({self.max_tokens})")
        for t in (*self.stop_token_ids, *self.eos_token_ids):
            if t < 0:
                raise ValueError(f"token ids must be >= 0, got {t}")

    @property
    def end_token_ids(self) -> frozenset[int]:
        ids = set(self.stop_token_ids)
        if not self.ignore_eos:
            ids.update(self.eos_token_ids)
        return frozenset(ids)


LOOKUP_SOURCES = ("context", "corpus", "output")
ALL_SOURCES = (*LOOKUP_SOURCES, "draft_model")
MAX_DRAFT_TOKENS = 256  # the largest draft tree a request may ask for (nodes per step)


@dataclass(frozen=True)
class SpecParams:
    """Per-request speculation control.

    ``enabled`` False is plain decoding. ``max_draft_tokens`` caps the draft tree's node count per
    step (the cost model may choose fewer, down to 0). ``sources`` names the drafters this request may
    use; ``collections`` the document collections the corpus drafter reads; ``tree`` False restricts
    drafts to a single chain.
    """

    enabled: bool = True
    max_draft_tokens: int = 32
    sources: tuple[str, ...] = ALL_SOURCES
    collections: tuple[str, ...] = ()
    tree: bool = True

    def for_request(self, *, enabled: bool = True, max_draft_tokens: int | None = None,
                    sources: Sequence[str] | None = None, collections: Sequence[str] = ()) -> SpecParams:
        """This (server-wide) setting narrowed by one request's ``lookup`` options: speculation only if
        both allow it; ``None`` keeps this setting's value; duplicates dropped, order kept."""
        return dataclasses.replace(
            self,
            enabled=self.enabled and enabled,
            max_draft_tokens=self.max_draft_tokens if max_draft_tokens is None else max_draft_tokens,
            sources=self.sources if sources is None else tuple(dict.fromkeys(sources)),
            collections=tuple(dict.fromkeys(collections)),
        )

    def __post_init__(self) -> None:
        if not 0 <= self.max_draft_tokens <= MAX_DRAFT_TOKENS:
            raise ValueError(f"max_draft_tokens must be in [0, {MAX_DRAFT_TOKENS}], "
                             f"got {self.max_draft_tokens}")
        unknown = set(self.sources) - set(ALL_SOURCES)
        if unknown:
            raise ValueError(f"unknown lookup sources {sorted(unknown)}; known: {', '.join(ALL_SOURCES)}")


@dataclass(frozen=True)
class LookupScope:
    """Where one request may draft from (besides its own context): the token stores of the request's
    document collections (plus a throw-away store holding its inline documents) and its namespace's
    output index. The stores are ``lookupspec.index`` objects; the gateway or the caller owns them and
    keeps them up to date, the engine only reads them. A namespace's scope never holds another
    namespace's stores: that is how isolation is enforced."""

    corpora: tuple[Any, ...] = ()  # lookupspec.index.CorpusIndex
    output: Any | None = None  # lookupspec.index.OutputIndex
