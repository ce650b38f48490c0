"""Speculative decoding on the real SmolLM2 model over real prompts (the 48-prompt bench set): the
output is token-identical to the plain loop (itself identical to transformers greedy, see
test_real_model.py) with every drafter combination.

A divergence is reported with its position and the target's top-2 logit gap there: the tree forward
computes the same logits as the one-token forward up to float rounding, so a divergence could only
appear where the top-2 gap is within rounding (none was seen on these prompts)."""

from __future__ import annotations

import pytest
import torch

from lookupspec.benchmarks.prompts import DEFAULT_PROMPTS, load_prompts
from lookupspec.cost import BudgetPolicy
from lookupspec.drafting.derived import derive_draft
from lookupspec.engine import Engine
from lookupspec.models import eos_token_ids, render_chat
from lookupspec.params import LOOKUP_SOURCES, GenerationParams, SpecParams

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

MAX_TOKENS = 64


def _prompts(per_kind: int):
    rows = load_prompts(DEFAULT_PROMPTS)
    out, seen = [], {}
    for r in rows:
        if seen.get(r.kind, 0) < per_kind:
            seen[r.kind] = seen.get(r.kind, 0) + 1
            out.append(r)
    return out


PROMPTS_8 = _prompts(2)  # two per kind; the 48 prompts are compared in bench-batch and bench-serve
PROMPTS_4 = _prompts(1)


@pytest.fixture(scope="module")
def engines(real_text_engine):
    model = real_text_engine.loaded.model
    adaptive = Engine(model, context_window=real_text_engine.loaded.context_window)
    adaptive.warmup()
    fixed_dm = Engine(model, draft_model=derive_draft(model, "self:layers=8"),
                      policy=BudgetPolicy(adaptive=False))
    return {"plain": Engine(model), "adaptive": adaptive, "fixed_dm": fixed_dm}


@pytest.fixture(scope="module")
def plain_outputs(real_text_engine, engines):
    eos = eos_token_ids(real_text_engine.loaded)
    cache = {}

    def get(row):
        if row.id not in cache:
            ids = render_chat(real_text_engine.tokenizer, row.messages)
            params = GenerationParams(max_tokens=MAX_TOKENS, eos_token_ids=eos)
            steps = engines["plain"].generate(ids, params, spec=SpecParams(enabled=False))
            cache[row.id] = (ids, params, [t for s in steps for t in s.tokens])
        return cache[row.id]

    return get


def _report(model, ids, plain, got):
    """Position of the first difference and the target's top-2 logit gap there."""
    k = next(i for i in range(min(len(plain), len(got))) if plain[i] != got[i])
    with torch.inference_mode():
        logits = model(torch.tensor([ids + plain[:k]])).logits[0, -1]
    top = torch.topk(logits.float(), 2).values
    return f"diverged at new token {k}: top-2 logit gap {float(top[0] - top[1]):.3g}"


def _check(engine, spec, row, plain_outputs, model):
    ids, params, plain = plain_outputs(row)
    steps = list(engine.generate(ids, params, spec=spec))
    got = [t for s in steps for t in s.tokens]
    assert got == plain, _report(model, ids, plain, got) if got != plain else ""
    return steps[-1].stats


@pytest.mark.parametrize("row", PROMPTS_8, ids=[r.id for r in PROMPTS_8])
def test_lookup_tree_speculation_equals_plain_greedy(engines, plain_outputs, real_text_engine, row):
    _check(engines["adaptive"], SpecParams(sources=LOOKUP_SOURCES), row, plain_outputs,
           real_text_engine.loaded.model)


# Every combination on one prompt per kind, but the draft model alone on two kinds: it drafts one
# forward per token (~17 s a prompt on two cores), and its exactness is also tested on both tiny
# families (tests/engine/test_spec_exactness.py).
COMBOS = [(combo, row) for combo in ("lookup-chain", "draft-model-only", "lookup+draft-model")
          for row in (PROMPTS_4[:2] if combo == "draft-model-only" else PROMPTS_4)]


@pytest.mark.parametrize(("combo", "row"), COMBOS, ids=[f"{c}-{r.id}" for c, r in COMBOS])
def test_every_drafter_combination_equals_plain_greedy(engines, plain_outputs, real_text_engine, row, combo):
    model = real_text_engine.loaded.model
    if combo == "lookup-chain":
        spec = SpecParams(sources=LOOKUP_SOURCES, tree=False)
        stats = _check(engines["adaptive"], spec, row, plain_outputs, model)
    elif combo == "draft-model-only":
        stats = _check(engines["fixed_dm"], SpecParams(sources=("draft_model",), max_draft_tokens=4), row,
                       plain_outputs, model)
        assert stats.draft_tokens_by_source.get("draft_model", 0) > 0
    else:
        stats = _check(engines["fixed_dm"], SpecParams(max_draft_tokens=8), row, plain_outputs, model)
        assert stats.draft_tokens > 0


def test_lookups_are_accepted_on_copy_heavy_prompts(engines, plain_outputs, real_text_engine):
    """Not a speed test: proves the real drafters propose tokens the real model accepts."""
    rows = [r for r in PROMPTS_8 if r.kind == "code_edit"]
    accepted = sum(_check(engines["adaptive"], SpecParams(sources=LOOKUP_SOURCES), r, plain_outputs,
                          real_text_engine.loaded.model).accepted_tokens for r in rows)
    assert accepted >= 2 * len(rows)
