"""Hypothesis strategies shared by the index tests: random and adversarial token sequences."""

from __future__ import annotations

from hypothesis import strategies as st

from lookupspec.index import LookupConfig


@st.composite
def token_lists(draw, min_size: int = 0, max_size: int = 60) -> list[int]:
    """Random tokens over a small vocabulary, with copied spans, runs of one token, or vocab of 2."""
    kind = draw(st.sampled_from(["random", "vocab2", "single", "copies"]))
    if kind == "single":
        n = draw(st.integers(min_size, max_size))
        return [draw(st.integers(0, 5))] * n
    vocab = 2 if kind == "vocab2" else draw(st.integers(1, 8))
    toks = draw(st.lists(st.integers(0, vocab - 1), min_size=min_size, max_size=max_size))
    if kind == "copies" and len(toks) >= 4:
        for _ in range(draw(st.integers(1, 3))):
            a = draw(st.integers(0, len(toks) - 2))
            b = draw(st.integers(a + 1, len(toks)))
            at = draw(st.integers(0, len(toks)))
            toks = toks[:at] + toks[a:b] + toks[at:]
        toks = toks[:max_size]
    return toks


@st.composite
def configs(draw, max_occurrences: int | None = None) -> LookupConfig:
    max_match = draw(st.integers(1, 10))
    return LookupConfig(
        min_match=draw(st.integers(1, max_match)),
        max_match=max_match,
        width=draw(st.integers(1, 3)),
        max_depth=draw(st.integers(1, 6)),
        max_nodes=draw(st.integers(1, 24)),
        max_occurrences=max_occurrences if max_occurrences else draw(st.integers(2, 6)),
    )


@st.composite
def tails(draw, texts: list[list[int]]) -> list[int]:
    """A tail that often ends like a piece of the text (so lookups hit), sometimes anything."""
    pieces = [t for t in texts if t]
    if pieces and draw(st.booleans()):
        t = draw(st.sampled_from(pieces))
        end = draw(st.integers(1, len(t)))
        start = draw(st.integers(0, end - 1))
        prefix = draw(st.lists(st.integers(0, 7), max_size=3))
        return prefix + t[start:end]
    return draw(st.lists(st.integers(0, 7), max_size=12))
