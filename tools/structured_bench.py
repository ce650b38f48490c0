"""Structured extraction with speculation on and off, and what the grammar costs per step.

Run: ``.venv/bin/python -m tools bench-structured [--model M] [--docs N] [--batch B] [--max-tokens T]
[--prompts FILE]``

Each document is a short record in prose; the schema's values are spans of it (names, places,
numbers), the case lookup drafting is made for. ``--prompts fixtures/bench/extraction.jsonl`` takes
the first N prompts of a benchmark prompt file instead, each with its own ``response_format``.
Greedy, the same engine for both runs (speculation off, then on), ``B`` sequences stepped together.
Reports per mode: output tokens/s over the decode steps, mean step time, and the grammar's share
of it: the time spent in ``LogitsProcessor.prune`` (the tree walk and mask computation, before the
forward; with speculation on, the grammar's drafts too) and ``LogitsProcessor.apply`` (masks and
penalties applied to the rows), summed over all sequences of a step. Checks that the outputs are the
same with speculation on and off and that every finished output validates. Not installed with
the package (a top-level tool).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"}, "city": {"type": "string"}, "company": {"type": "string"},
        "role": {"type": "string"}, "year": {"type": "integer"},
    },
    "required": ["name", "city", "company", "role", "year"],
    "additionalProperties": False,
}
PEOPLE = [("Ada Lovelace", "London", "Analytical Engines Ltd", "chief engineer", 1843),
          ("Grace Hopper", "Arlington", "Remington Rand", "senior mathematician", 1952),
          ("Alan Turing", "Manchester", "Ferranti Computing", "deputy director", 1949),
          ("Katherine Johnson", "Hampton", "Langley Research Center", "research mathematician", 1953),
          ("Edsger Dijkstra", "Eindhoven", "Mathematisch Centrum", "lead programmer", 1959),
          ("Barbara Liskov", "Cambridge", "Mitre Corporation", "systems researcher", 1968),
          ("Donald Knuth", "Stanford", "Burroughs Corporation", "compiler consultant", 1960),
          ("Frances Allen", "Poughkeepsie", "International Business Machines", "research scientist", 1957)]


def _messages(person: tuple[str, str, str, str, int]) -> list[dict[str, str]]:
    name, city, company, role, year = person
    doc = (f"In {year}, {name} moved to {city} to join {company}. At {company}, {name} worked as "
           f"{role}, and colleagues in {city} remember the {role} for careful work.")
    return [{"role": "system", "content": "Extract the fields as JSON."},
            {"role": "user", "content": f"{doc}\nReturn name, city, company, role and year."}]


def configure(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", default=None,
                    help="a prompt file whose rows carry a response_format (fixtures/bench/extraction.jsonl)")


def _timed(cls: Any, name: str, bucket: list[float]) -> None:
    orig = getattr(cls, name)

    def wrapper(self: Any, *a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return orig(self, *a, **k)
        finally:
            bucket[0] += time.perf_counter() - t0

    setattr(cls, name, wrapper)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from lookupspec.benchmarks.prompts import load_prompts
    from lookupspec.benchmarks.validity import output_checker
    from lookupspec.constraints import GrammarCompiler, GrammarSpec
    from lookupspec.logits import LogitsParams, LogitsProcessor
    from lookupspec.params import SpecParams
    from lookupspec.text import TextEngine

    te = TextEngine.load(args.model)
    te.engine.warmup()
    compiler = GrammarCompiler(te.tokenizer, te.engine.vocab_size, te.eos_token_ids)
    base = te.params(max_tokens=args.max_tokens)
    if args.prompts:
        rows = [p for p in load_prompts(args.prompts) if p.schema is not None][: args.docs]
        messages = [list(p.messages) for p in rows]
        schemas = [p.schema for p in rows if p.schema is not None]
        strict = [bool(p.response_format and p.response_format["json_schema"].get("strict")) for p in rows]
    else:
        people = (PEOPLE * (args.docs // len(PEOPLE) + 1))[: args.docs]
        messages = [_messages(p) for p in people]
        schemas, strict = [SCHEMA] * len(people), [True] * len(people)
    checks = [output_checker({"type": "json_schema", "json_schema": {"schema": s}}) for s in schemas]
    params = [dataclasses.replace(base, logits=LogitsParams(grammar=compiler.compile(
        GrammarSpec.json_schema(s, st)))) for s, st in zip(schemas, strict, strict=True)]
    prompts = [te.encode_text(te.chat_text(m), add_special_tokens=False) for m in messages]
    grammar_s = [0.0]
    _timed(LogitsProcessor, "prune", grammar_s)
    _timed(LogitsProcessor, "apply", grammar_s)
    eng = te.engine
    results: dict[str, Any] = {}
    outputs: dict[str, list[list[int]]] = {}
    for mode, spec in (("off", SpecParams(enabled=False)), ("on", SpecParams())):
        outs: list[list[int]] = []
        decode_s, steps, tokens = 0.0, 0, 0
        grammar_s[0] = 0.0
        for start in range(0, len(prompts), args.batch):
            seqs = [eng.start(p, prm, spec) for p, prm in zip(prompts[start:start + args.batch],
                                                              params[start:start + args.batch], strict=True)]
            got = [list(eng.prefill(s).tokens) for s in seqs]  # type: ignore[union-attr]
            while any(s.running for s in seqs):
                live = [j for j, s in enumerate(seqs) if s.running]
                t0 = time.perf_counter()
                step = eng.step([seqs[j] for j in live])
                decode_s += time.perf_counter() - t0
                steps += 1
                for j, out in zip(live, step, strict=True):
                    got[j].extend(out.tokens)
                    tokens += len(out.tokens)
            outs.extend(got)
        outputs[mode] = outs
        valid = sum(check is not None and check(te.tokenizer.decode(o, skip_special_tokens=True)) is None
                    for o, check in zip(outs, checks, strict=True))
        results[mode] = {"tokens_per_s": round(tokens / decode_s, 2), "decode_steps": steps,
                         "step_ms": round(1e3 * decode_s / steps, 2),
                         "grammar_ms_per_step": round(1e3 * grammar_s[0] / steps, 3),
                         "grammar_share": round(grammar_s[0] / decode_s, 4), "valid": f"{valid}/{len(outs)}"}
    results["identical_on_off"] = outputs["on"] == outputs["off"]
    results["speedup"] = round(results["on"]["tokens_per_s"] / results["off"]["tokens_per_s"], 3)
    print(json.dumps({"model": args.model, "prompts": args.prompts, "docs": len(prompts), "batch": args.batch,
                      **results}))
    return 0
