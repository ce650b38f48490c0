"""Grammar masks, penalties, logit bias and min_tokens apply at every verified position with the state
of the path leading to it: greedy and seeded sampling give the same tokens with speculation on and
off, at batch 1 and 8; grammar outputs parse and validate; log-probabilities agree; a grammar dead end
ends its request alone."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scripted import ScriptedDrafting

from lookupspec.constraints import GrammarCompiler, GrammarSpec
from lookupspec.cost import BudgetPolicy
from lookupspec.engine import Engine
from lookupspec.logits import LogitsParams
from lookupspec.params import GenerationParams, SpecParams
from lookupspec.sampling import SamplingParams

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PROMPT = list(range(40, 90))
FIXED = BudgetPolicy(adaptive=False)  # verify every proposed node, so every path is exercised
EOS = 2
SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["alpha", "beta", "gamma"]},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2},
        "inner": {"type": "object", "properties": {"s": {"type": "string", "maxLength": 4}},
                  "required": ["s"]},
    },
    "required": ["kind", "ok", "n", "tags", "inner"],
}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(FIXTURES / "tokenizer"))


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GrammarCompiler(tokenizer, 512, [EOS])


def _options(compiler) -> dict[str, LogitsParams]:
    return {
        "schema": LogitsParams(grammar=compiler.compile(GrammarSpec.json_schema(SCHEMA))),
        "json_object": LogitsParams(grammar=compiler.compile(GrammarSpec.json_object())),
        "penalties": LogitsParams(frequency_penalty=1.5, presence_penalty=0.7, repetition_penalty=1.3),
        "bias": LogitsParams(logit_bias=((17, 8.0), (23, 6.5), (300, -100.0))),
        "min_tokens": LogitsParams(min_tokens=12),
        "all": LogitsParams(frequency_penalty=0.4, presence_penalty=0.3, repetition_penalty=1.1,
                            logit_bias=((EOS, -3.0),), min_tokens=3,
                            grammar=compiler.compile(GrammarSpec.json_schema(SCHEMA))),
    }


SAMPLINGS = {"greedy": SamplingParams(), "seeded": SamplingParams(temperature=0.9, top_p=0.95, seed=5)}


def _run(engine, params, spec):
    steps = list(engine.generate(PROMPT, params, spec=spec))
    return [t for s in steps for t in s.tokens], steps


def _params(logits: LogitsParams, sampling: SamplingParams, max_tokens: int = 48,
            stop: tuple[int, ...] = ()) -> GenerationParams:
    return GenerationParams(max_tokens=max_tokens, sampling=sampling, eos_token_ids=(EOS,), logits=logits,
                            stop_token_ids=stop)


def _early_stop(model, sampling: SamplingParams) -> tuple[int, ...]:
    """A stop token the unconstrained output reaches at its 4th token, so that min_tokens matters."""
    eng = Engine(model, lookup=ScriptedDrafting([], "none", 512))
    base, _ = _run(eng, _params(LogitsParams(), sampling, 8), SpecParams(enabled=False))
    return (base[3],)


def _check_json(tokenizer, tokens, finish, schema: dict | None) -> None:
    if finish != "stop":
        return  # cut by max_tokens: a prefix of a valid document
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    doc = json.loads(text)
    assert isinstance(doc, dict)
    if schema is not None:
        assert set(doc) == set(schema["required"])
        assert doc["kind"] in ("alpha", "beta", "gamma") and isinstance(doc["ok"], bool)
        assert isinstance(doc["n"], int) and 0 <= doc["n"] <= 999
        assert all(t in ("x", "y") for t in doc["tags"]) and len(doc["tags"]) <= 2
        assert isinstance(doc["inner"]["s"], str) and len(doc["inner"]["s"]) <= 4


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("sampling", list(SAMPLINGS), ids=list(SAMPLINGS))
@pytest.mark.parametrize("option", ["schema", "json_object", "penalties", "bias", "min_tokens", "all"])
def test_speculation_on_and_off_give_the_same_tokens(tiny_loaded, tokenizer, compiler, option, sampling,
                                                      shape):
    stop = _early_stop(tiny_loaded.model, SAMPLINGS[sampling]) if option == "min_tokens" else ()
    params = _params(_options(compiler)[option], SAMPLINGS[sampling], stop=stop)
    plain_eng = Engine(tiny_loaded.model, lookup=ScriptedDrafting([], "none", 512))
    plain, plain_steps = _run(plain_eng, params, SpecParams(enabled=False))
    eng = Engine(tiny_loaded.model, lookup=ScriptedDrafting(plain, shape, 512), policy=FIXED)
    got, steps = _run(eng, params, SpecParams(max_draft_tokens=8, tree=shape == "tree"))
    assert got == plain
    assert steps[-1].finish_reason == plain_steps[-1].finish_reason
    if len(plain) > 6:  # (an empty object "{}" then EOS leaves nothing to draft)
        assert steps[-1].stats.accepted_tokens > 0  # drafts were really accepted
        assert len(steps) < len(plain)
    if option in ("schema", "json_object", "all"):
        schema = SCHEMA if option != "json_object" else None
        _check_json(tokenizer, plain, plain_steps[-1].finish_reason, schema)
    if option == "min_tokens":
        assert stop[0] not in plain[:11] and len(plain) >= 12


def test_the_options_change_the_output(tiny_loaded, compiler):
    """Each option really rewrites the logits (else the exactness test above proves nothing)."""
    eng = Engine(tiny_loaded.model, lookup=ScriptedDrafting([], "none", 512))
    stop = _early_stop(tiny_loaded.model, SamplingParams())
    for name, opt in _options(compiler).items():
        stops = stop if name == "min_tokens" else ()
        base, _ = _run(eng, _params(LogitsParams(), SamplingParams(), stop=stops), SpecParams(enabled=False))
        got, _ = _run(eng, _params(opt, SamplingParams(), stop=stops), SpecParams(enabled=False))
        assert got != base, name


def test_grammar_prunes_drafts_before_the_forward(tiny_loaded, compiler):
    """The scripted tree's wrong siblings are refused by the grammar: they are never verified."""
    params = _params(_options(compiler)["schema"], SamplingParams())
    plain, _ = _run(Engine(tiny_loaded.model, lookup=ScriptedDrafting([], "none", 512)), params,
                    SpecParams(enabled=False))
    eng = Engine(tiny_loaded.model, lookup=ScriptedDrafting(plain, "tree", 512), policy=FIXED)
    got, steps = _run(eng, params, SpecParams(max_draft_tokens=8))
    assert got == plain
    unconstrained = Engine(tiny_loaded.model, lookup=ScriptedDrafting(plain, "tree", 512), policy=FIXED)
    _, free_steps = _run(unconstrained, _params(LogitsParams(), SamplingParams(), len(plain)),
                         SpecParams(max_draft_tokens=8))
    verified = steps[-1].stats.draft_tokens / steps[-1].stats.steps
    assert verified < free_steps[-1].stats.draft_tokens / free_steps[-1].stats.steps


@pytest.mark.parametrize("sampling", list(SAMPLINGS), ids=list(SAMPLINGS))
def test_batch_of_eight_mixed_options_equals_each_alone(tiny_loaded, compiler, sampling):
    opts = [*_options(compiler).values(), LogitsParams(), LogitsParams(logprobs=2)]
    prompts = [[40 + 3 * j + k for k in range(30 + j)] for j in range(8)]
    params = [_params(opts[j], SAMPLINGS[sampling], 32) for j in range(8)]
    plain_eng = Engine(tiny_loaded.model, lookup=ScriptedDrafting([], "none", 512))
    alone = []
    for p, prm in zip(prompts, params, strict=True):
        steps = list(plain_eng.generate(p, prm, spec=SpecParams(enabled=False)))
        alone.append([t for s in steps for t in s.tokens])
    truth = {tuple(p): a for p, a in zip(prompts, alone, strict=True)}
    eng = Engine(tiny_loaded.model, lookup=ScriptedDrafting(truth, "tree", 512), policy=FIXED)
    seqs = [eng.start(p, prm, SpecParams(max_draft_tokens=8)) for p, prm in zip(prompts, params, strict=True)]
    got: list[list[int]] = [list(eng.prefill(s).tokens) for s in seqs]  # type: ignore[union-attr]
    while any(s.running for s in seqs):
        live = [j for j, s in enumerate(seqs) if s.running]
        for j, out in zip(live, eng.step([seqs[j] for j in live]), strict=True):
            got[j].extend(out.tokens)
    assert got == alone


def test_logprobs_agree_with_speculation_on_and_off(tiny_loaded, compiler):
    """Raw log-softmax of the verifying forward's row; on and off differ only by the float rounding of
    the two forward shapes (tolerance 1e-4, far below any token's log-probability gap we compare)."""
    params = _params(LogitsParams(logprobs=3, grammar=compiler.compile(GrammarSpec.json_object())),
                     SamplingParams())
    plain, plain_steps = _run(Engine(tiny_loaded.model, lookup=ScriptedDrafting([], "none", 512)), params,
                              SpecParams(enabled=False))
    eng = Engine(tiny_loaded.model, lookup=ScriptedDrafting(plain, "tree", 512), policy=FIXED)
    got, steps = _run(eng, params, SpecParams(max_draft_tokens=8))
    assert got == plain
    off = [lp for s in plain_steps for lp in s.logprobs]
    on = [lp for s in steps for lp in s.logprobs]
    assert [lp.token for lp in on] == got == [lp.token for lp in off]
    for a, b in zip(on, off, strict=True):
        assert math.isclose(a.logprob, b.logprob, abs_tol=1e-4)
        assert a.logprob <= 0.0 and len(a.top) == 3
        assert [t for t, _ in a.top] == [t for t, _ in b.top] or all(
            math.isclose(x, y, abs_tol=1e-4) for (_, x), (_, y) in zip(a.top, b.top, strict=True))
        assert a.top[0][1] >= a.logprob - 1e-6  # the best alternative is at least as likely


def test_grammar_dead_end_ends_that_request_alone(tiny_loaded, tokenizer, compiler):
    """min_tokens longer than the only document the schema allows: once it is complete nothing is
    allowed; that request ends with an error, its neighbour in the batch goes on."""
    schema = {"type": "object", "properties": {"a": {"enum": ["x"]}}, "required": ["a"],
              "additionalProperties": False}
    dead = _params(LogitsParams(min_tokens=30, grammar=compiler.compile(GrammarSpec.json_schema(schema))),
                   SamplingParams(), 40)
    other = _params(LogitsParams(), SamplingParams(), 40)
    eng = Engine(tiny_loaded.model, lookup=ScriptedDrafting([], "none", 512))
    a, b = eng.start(PROMPT, dead, SpecParams(enabled=False)), eng.start(PROMPT[:-1], other,
                                                                         SpecParams(enabled=False))
    outs = {id(s): list(eng.prefill(s).tokens) for s in (a, b)}  # type: ignore[union-attr]
    last = None
    while b.running:
        live = [s for s in (a, b) if s.running]
        for s, out in zip(live, eng.step(live), strict=True):
            outs[id(s)].extend(out.tokens)
            if s is a and out.finish_reason:
                last = out
    assert a.finish_reason == "error" and last is not None and "min_tokens" in (last.error or "")
    assert json.loads(tokenizer.decode(outs[id(a)])) == {"a": "x"}
    assert len(outs[id(b)]) == 40 and b.finish_reason == "length"


def test_the_grammar_drafts_the_text_it_forces_and_the_output_does_not_change(tiny_loaded, compiler):
    """No drafter proposes anything: every draft node is the grammar's (the schema's keys and
    punctuation), almost all accepted; the tokens are plain decoding's. Speculation off drafts none."""
    params = _params(_options(compiler)["schema"], SamplingParams(), 64)
    plain, plain_steps = _run(Engine(tiny_loaded.model, lookup=ScriptedDrafting([], "none", 512)), params,
                              SpecParams(enabled=False))
    assert plain_steps[-1].stats.draft_tokens == 0
    got, steps = _run(Engine(tiny_loaded.model, lookup=ScriptedDrafting([], "none", 512)), params,
                      SpecParams(max_draft_tokens=8))
    assert got == plain
    stats = steps[-1].stats
    assert set(stats.draft_tokens_by_source) == {"grammar"} and stats.accepted_tokens_by_source["grammar"] > 5
    assert len(steps) < len(plain_steps)
