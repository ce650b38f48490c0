"""Incremental detokenization and stop strings on the fixture tokenizer."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from lookupspec.detokenize import TextStream


@pytest.fixture(scope="module")
def tok(tiny_models):
    return AutoTokenizer.from_pretrained(str(tiny_models["tiny-llama"]))


TEXT = "Hello wörld — naïve café: json.dumps(obj, indent=2) returns a str. 日本語 ok."


def test_token_by_token_stream_reproduces_the_text(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    ts = TextStream(tok)
    out = "".join(ts.push([i]) for i in ids) + ts.flush()
    assert out == TEXT
    assert ts.stop_reached is None


def test_stop_string_across_tokens_is_removed(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    ts = TextStream(tok, stop=["indent=2"])
    released = []
    for i in ids:
        released.append(ts.push([i]))
        if ts.stop_reached:
            break
    out = "".join(released)
    assert ts.stop_reached == "indent=2"
    assert out == TEXT[: TEXT.index("indent=2")]


def test_held_back_text_is_never_part_of_a_stop_string(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    ts = TextStream(tok, stop=["returns a str"])
    released = ""
    for i in ids:
        released += ts.push([i])
        assert "returns a" not in released or ts.stop_reached
        if ts.stop_reached:
            break
    assert released == TEXT[: TEXT.index("returns a str")]


def test_earliest_of_several_stop_strings_wins(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    ts = TextStream(tok, stop=["ok.", "café"])
    out = ts.push(ids)
    assert ts.stop_reached == "café"
    assert out == TEXT[: TEXT.index("café")]


def test_flush_releases_a_partial_stop_prefix(tok):
    ids = tok.encode("the end of inde", add_special_tokens=False)
    ts = TextStream(tok, stop=["indent"])
    out = ts.push(ids) + ts.flush()
    assert out == "the end of inde"


def test_empty_stop_string_is_rejected(tok):
    with pytest.raises(ValueError):
        TextStream(tok, stop=[""])
