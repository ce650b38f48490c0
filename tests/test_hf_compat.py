"""The KV-cache keyword follows the installed transformers: ``cache`` from 5.24, ``past_key_values``
before (the suite turns the FutureWarning of the old name into an error, so every model call that
passes a cache is checked by the tests that make it; this pins the rule itself)."""

from __future__ import annotations

import inspect

import transformers

from lookupspec.hf_compat import cache_keyword, with_cache


def test_the_keyword_is_the_one_the_installed_forward_takes(tiny_models) -> None:
    from lookupspec.models import load_model

    model = load_model(str(tiny_models["tiny-llama"])).model
    params = inspect.signature(type(model).forward).parameters
    word = cache_keyword(model)
    assert word in params
    assert word == ("cache" if "cache" in params else "past_key_values")
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    assert (word == "cache") == ((major, minor) >= (5, 24))
    assert with_cache(model, None) == {word: None}
