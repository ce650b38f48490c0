"""The plain decode loop on both tiny architecture families: exactness against transformers and the
behaviour of every stop condition."""

from __future__ import annotations

import pytest
import torch
from reference import complete

from lookupspec.engine import finish_tokens
from lookupspec.params import GenerationParams

PROMPTS = [
    "Summarize: the json module encodes and decodes JSON documents.",
    "def parse_args(argv):\n    parser = argparse.ArgumentParser()\n",
    "Return a new deque object initialized left-to-right with data from iterable.",
]


def _hf_greedy(te, ids, n):
    x = torch.tensor([ids])
    out = te.loaded.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)
    return out[0][len(ids):].tolist()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_equals_transformers_generate(tiny_text_engine, prompt):
    te = tiny_text_engine
    ids = te.encode_prompt(prompt=prompt)
    ours = complete(te, prompt_ids=ids, max_tokens=48, ignore_eos=True)
    assert ours.token_ids == _hf_greedy(te, ids, 48)
    assert ours.finish_reason == "length"


def test_greedy_streams_one_token_per_step(tiny_text_engine):
    te = tiny_text_engine
    steps = list(te.engine.generate(te.encode_prompt(prompt=PROMPTS[0]), te.params(max_tokens=5)))
    assert [len(s.tokens) for s in steps] == [1] * len(steps)
    assert steps[-1].finish_reason in ("length", "stop")


def test_seeded_sampling_is_reproducible_and_seeds_differ(tiny_text_engine):
    te = tiny_text_engine
    kw = {"prompt": PROMPTS[1], "max_tokens": 32, "temperature": 1.0, "ignore_eos": True}
    a = complete(te, seed=11, **kw).token_ids
    b = complete(te, seed=11, **kw).token_ids
    c = complete(te, seed=12, **kw).token_ids
    assert a == b
    assert a != c


def test_temperature_to_zero_and_top_k_one_equal_greedy(tiny_text_engine):
    te = tiny_text_engine
    greedy = complete(te, prompt=PROMPTS[2], max_tokens=32, ignore_eos=True).token_ids
    cold = complete(te, prompt=PROMPTS[2], max_tokens=32, ignore_eos=True, temperature=1e-4, seed=5)
    topk1 = complete(te, prompt=PROMPTS[2], max_tokens=32, ignore_eos=True, temperature=1.5, top_k=1, seed=5)
    assert cold.token_ids == greedy
    assert topk1.token_ids == greedy


def test_top_p_small_equals_greedy(tiny_text_engine):
    te = tiny_text_engine
    greedy = complete(te, prompt=PROMPTS[0], max_tokens=24, ignore_eos=True).token_ids
    nucleus = complete(te, prompt=PROMPTS[0], max_tokens=24, ignore_eos=True, temperature=1.0,
                          top_p=1e-6, seed=9).token_ids
    assert nucleus == greedy


def test_max_tokens_gives_length(tiny_text_engine):
    c = complete(tiny_text_engine, prompt=PROMPTS[0], max_tokens=7, ignore_eos=True)
    assert c.completion_tokens == 7
    assert c.finish_reason == "length"


def test_stop_token_id_ends_with_stop(tiny_text_engine):
    te = tiny_text_engine
    full = complete(te, prompt=PROMPTS[0], max_tokens=30, ignore_eos=True).token_ids
    target = full[10]
    first = full.index(target)
    c = complete(te, prompt=PROMPTS[0], max_tokens=30, ignore_eos=True, stop_token_ids=[target])
    assert c.token_ids == full[: first + 1]
    assert c.finish_reason == "stop"


def test_stop_string_cuts_text_and_ends_with_stop(tiny_text_engine):
    te = tiny_text_engine
    full = complete(te, prompt=PROMPTS[1], max_tokens=40, ignore_eos=True)
    text = full.text
    stop = text[15:19]
    assert len(stop.strip()) > 0
    c = complete(te, prompt=PROMPTS[1], max_tokens=40, ignore_eos=True, stop=[stop])
    assert c.finish_reason == "stop"
    assert c.text == text[: text.index(stop)]
    assert stop not in c.text


def test_eos_ends_generation(tiny_text_engine):
    te = tiny_text_engine
    full = complete(te, prompt=PROMPTS[2], max_tokens=30, ignore_eos=True).token_ids
    eos_like = full[5]
    params = GenerationParams(max_tokens=30, eos_token_ids=(eos_like,))
    steps = list(te.engine.generate(te.encode_prompt(prompt=PROMPTS[2]), params))
    tokens = [t for s in steps for t in s.tokens]
    assert tokens == full[: full.index(eos_like) + 1]
    assert steps[-1].finish_reason == "stop"


def test_context_window_ends_with_length(tiny_text_engine):
    te = tiny_text_engine
    ids = te.encode_prompt(prompt=PROMPTS[0])
    from lookupspec.engine import Engine

    small = Engine(te.loaded.model, context_window=len(ids) + 3)
    steps = list(small.generate(ids, GenerationParams(max_tokens=50)))
    assert sum(len(s.tokens) for s in steps) == 3
    assert steps[-1].finish_reason == "length"


def test_bad_prompts_raise(tiny_text_engine):
    te = tiny_text_engine
    with pytest.raises(ValueError, match="at least one token"):
        next(te.engine.generate([], GenerationParams()))
    with pytest.raises(ValueError, match="token ids"):
        next(te.engine.generate([10**6], GenerationParams()))


def test_finish_tokens_cuts_at_end_token_and_limit():
    p = GenerationParams(max_tokens=10, eos_token_ids=(2,))
    assert finish_tokens([5, 2, 7], 0, p, 100) == ([5, 2], "stop")
    assert finish_tokens([5, 6], 9, p, 100) == ([5], "length")
    assert finish_tokens([5, 6], 0, p, 1) == ([5], "length")
    assert finish_tokens([5, 6], 0, p, 100) == ([5, 6], None)
    assert finish_tokens([2], 0, GenerationParams(eos_token_ids=(2,), ignore_eos=True), 100) == ([2], None)
