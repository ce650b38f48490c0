"""Measure the two maintained grammar libraries (xgrammar, llguidance) on what lookupspec needs.

Run: ``.venv/bin/python -m tools bench-grammar [--model DIR] [--repeats N]``

For SmolLM2's tokenizer (49,152 tokens) and a JSON schema with nested objects, arrays, an enum,
numbers and strings with escapes, it reports per library:

- ``compile_ms``: schema -> compiled grammar (once per request, or cached per schema);
- ``mask_us``: one allowed-token bitmask for the current state (once per verified row);
- ``consume_us``: advance the state by one token;
- ``rollback_us``: undo one token (a draft tree is walked depth first: consume a node, compute its
  mask, visit its children, roll back);
- ``fork_us``: copy a whole state (the alternative to rollback for trees);
- ``apply_us``: apply one bitmask to one row of float32 logits (torch, CPU).

Timings are per call, median and p99 over the tokens of a valid document, repeated ``--repeats``
times. Not installed with the package (a top-level tool); llguidance is not a lookupspec dependency:
``.venv/bin/pip install llguidance`` first to compare.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "year": {"type": "integer"},
        "score": {"type": "number"},
        "status": {"enum": ["draft", "final", "retracted"]},
        "authors": {"type": "array", "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "affiliation": {"type": "string"}},
            "required": ["name", "affiliation"], "additionalProperties": False}},
        "quote": {"type": "string"},
    },
    "required": ["title", "year", "score", "status", "authors", "quote"],
    "additionalProperties": False,
}
DOCUMENT = {
    "title": "Speculative decoding for retrieval-heavy workloads",
    "year": 2024, "score": 3.75, "status": "final",
    "authors": [{"name": "Ada Lovelace", "affiliation": "Analytical Engines Ltd."},
                {"name": "Alan Turing", "affiliation": "University of Manchester"}],
    "quote": "He said \"copy what you can\"\nand verify the rest\t(twice).",
}


def _stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    p99 = s[int(0.99 * (len(s) - 1))]
    return {"median": round(statistics.median(s) * 1e6, 1), "p99": round(p99 * 1e6, 1)}


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_llguidance(hf_tok: Any, tokens: list[int], repeats: int, vocab: int) -> dict[str, Any]:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    t0 = time.perf_counter()
    tok = llguidance.hf.from_tokenizer(hf_tok, n_vocab=vocab, eos_token=hf_tok.eos_token_id)
    tokenizer_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    m = llguidance.LLMatcher(tok, grammar)
    compile_s = time.perf_counter() - t0
    assert not m.is_error(), m.get_error()
    mask = llguidance.torch.allocate_token_bitmask(1, vocab)
    logits = torch.randn(1, vocab)
    out: dict[str, list[float]] = {"mask": [], "consume": [], "rollback": [], "fork": [], "apply": []}
    for _ in range(repeats):
        m.reset()
        for t in tokens:
            out["mask"].append(_timed(lambda: llguidance.torch.fill_next_token_bitmask(m, mask, 0)))
            out["apply"].append(_timed(lambda: llguidance.torch.apply_token_bitmask_inplace(logits, mask)))
            assert m.consume_token(t), m.get_error()
            out["rollback"].append(_timed(lambda: m.rollback(1)))
            m.consume_token(t)
            out["fork"].append(_timed(m.deep_copy))
            m.rollback(1)
            out["consume"].append(_timed(functools.partial(m.consume_token, t)))
    return {"tokenizer_ms": round(tokenizer_s * 1e3, 1), "compile_ms": round(compile_s * 1e3, 2),
            **{f"{k}_us": _stats(v) for k, v in out.items()}}


def bench_xgrammar(hf_tok: Any, tokens: list[int], repeats: int, vocab: int) -> dict[str, Any]:
    import xgrammar

    t0 = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(hf_tok, vocab_size=vocab)
    compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    tokenizer_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(", ", ": "))
    m = xgrammar.GrammarMatcher(compiled)
    compile_s = time.perf_counter() - t0
    mask = xgrammar.allocate_token_bitmask(1, vocab)
    logits = torch.randn(1, vocab)
    out: dict[str, list[float]] = {"mask": [], "consume": [], "rollback": [], "fork": [], "apply": []}
    for _ in range(repeats):
        m.reset()
        for t in tokens:
            out["mask"].append(_timed(lambda: m.fill_next_token_bitmask(mask, 0)))
            out["apply"].append(_timed(lambda: xgrammar.apply_token_bitmask_inplace(logits, mask)))
            assert m.accept_token(t)
            out["rollback"].append(_timed(lambda: m.rollback(1)))
            m.accept_token(t)
            out["fork"].append(_timed(m.fork))
            m.rollback(1)
            out["consume"].append(_timed(functools.partial(m.accept_token, t)))
    return {"tokenizer_ms": round(tokenizer_s * 1e3, 1), "compile_ms": round(compile_s * 1e3, 2),
            **{f"{k}_us": _stats(v) for k, v in out.items()}}


def configure(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=str(Path.home() / ".cache/lookupspec/models/smollm2-135m-instruct"))
    ap.add_argument("--repeats", type=int, default=5)


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    hf_tok = AutoTokenizer.from_pretrained(args.model)
    vocab = len(hf_tok)
    text = json.dumps(DOCUMENT)  # ", " and ": ": both libraries' default separators
    # no EOS: llguidance 1.9.1 rejects EOS again after rolling back an accepted EOS, so the engine never
    # rolls back over an end token (an end token ends a draft path); the bench times the JSON tokens
    tokens = hf_tok.encode(text, add_special_tokens=False)
    print(json.dumps({"vocab": vocab, "document_tokens": len(tokens)}))
    for name, fn in (("llguidance", bench_llguidance), ("xgrammar", bench_xgrammar)):
        print(json.dumps({"library": name, **fn(hf_tok, tokens, args.repeats, vocab)}))
    return 0
