"""lookupspec.prompt_bound: the byte bound the gateway refuses over-long prompts by, before tokenizing,
never refuses a prompt that fits: for any text, tokens >= countable bytes / L (property-tested
against the real tokenizers, with text built from their own longest tokens)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lookupspec.prompt_bound import PromptBound

FIXTURE_TOKENIZER = Path(__file__).resolve().parents[1] / "fixtures" / "tokenizer"


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(FIXTURE_TOKENIZER))


def _texts(tokenizer) -> st.SearchStrategy[str]:
    """Arbitrary Unicode, and runs of the tokenizer's longest tokens (the worst case for the bound)."""
    vocab = tokenizer.get_vocab()
    longest = sorted(vocab, key=len, reverse=True)[:20]
    pieces = [tokenizer.convert_tokens_to_string([t]) for t in longest] + ["\x04", "\U00050000", " ", "é"]
    runs = st.lists(st.sampled_from(pieces), max_size=60).map("".join)
    return st.one_of(st.text(max_size=300), runs, st.tuples(st.text(max_size=50), runs).map("".join))


def _check(tokenizer, bound: PromptBound, text: str) -> None:
    tokens = len(tokenizer.encode(text, add_special_tokens=False))
    assert bound.countable_bytes(text) <= bound.bytes_per_token * tokens, (text, tokens)


def test_the_fixture_tokenizer_has_a_bound(tiny_tokenizer) -> None:
    bound = PromptBound.for_tokenizer(tiny_tokenizer)
    assert bound is not None and bound.bytes_per_token == 13  # "\n" + 12 spaces is its longest token
    assert bound.limit(256) == 13 * 255


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_text_has_fewer_tokens_than_its_countable_bytes_allow(tiny_tokenizer, data) -> None:
    bound = PromptBound.for_tokenizer(tiny_tokenizer)
    assert bound is not None
    _check(tiny_tokenizer, bound, data.draw(_texts(tiny_tokenizer)))


def test_tokenizers_that_may_drop_text_get_no_bound(tiny_tokenizer) -> None:
    from tokenizers import normalizers

    backend = tiny_tokenizer.backend_tokenizer
    original = backend.normalizer
    try:
        backend.normalizer = normalizers.NFKC()
        assert PromptBound.for_tokenizer(tiny_tokenizer) is None
    finally:
        backend.normalizer = original
    assert PromptBound.for_tokenizer(object()) is None


@pytest.mark.real_model
def test_smollm2s_bound_holds_and_skips_the_bytes_it_drops(real_model_dir) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(real_model_dir))
    bound = PromptBound.for_tokenizer(tokenizer)
    assert bound is not None and bound.bytes_per_token == 81
    # SmolLM2 has no token for these: BPE drops them, so they must not count
    assert tokenizer.encode("\x04" * 50, add_special_tokens=False) == []
    assert bound.countable_bytes("\x04" * 50) == 0
    assert bound.countable_bytes("\U00050000") == 3  # the lead byte 0xF1 is dropped, 3 bytes remain

    @settings(max_examples=150, deadline=None)
    @given(text=_texts(tokenizer))
    def holds(text: str) -> None:
        _check(tokenizer, bound, text)

    holds()
