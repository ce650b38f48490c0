"""Structured extraction with speculation on and off, and what the grammar costs per step.

Run: ``.venv/bin/python -m tools bench-structured [--model M] [--docs N] [--batch B] [--max-tokens T]``

Each document is a short record in prose; the schema's values are spans of it (names, places,
numbers), the case lookup drafting is made for. Greedy, the same engine for both runs (speculation
off, then on), ``B`` sequences stepped together. Reports per mode: output tokens/s over the decode
steps, mean step time, and the grammar's share of it: the time spent in ``LogitsProcessor.prune``
(the tree walk and mask computation, before the forward) and ``LogitsProcessor.apply`` (masks and
penalties applied to the rows), summed over all sequences of a step. Checks that the outputs are
the same with speculation on and off and that every finished output validates. Not installed with
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

    from lookupspec.constraints import GrammarCompiler, GrammarSpec
    from lookupspec.logits import LogitsParams, LogitsProcessor
    from lookupspec.params import SpecParams
    from lookupspec.text import TextEngine

    te = TextEngine.load(args.model)
    te.engine.warmup()
    grammar = GrammarCompiler(te.tokenizer, te.engine.vocab_size, te.eos_token_ids).compile(
        GrammarSpec.json_schema(SCHEMA))
    params = dataclasses.replace(te.params(max_tokens=args.max_tokens), logits=LogitsParams(grammar=grammar))
    people = (PEOPLE * (args.docs // len(PEOPLE) + 1))[: args.docs]
    prompts = [te.encode_text(te.chat_text(_messages(p)), add_special_tokens=False) for p in people]
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
            seqs = [eng.start(p, params, spec) for p in prompts[start:start + args.batch]]
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
        valid = 0
        for o in outs:
            try:
                doc = json.loads(te.tokenizer.decode(o, skip_special_tokens=True))
                valid += isinstance(doc, dict) and set(doc) == set(SCHEMA["required"])
            except ValueError:
                pass
        results[mode] = {"tokens_per_s": round(tokens / decode_s, 2), "decode_steps": steps,
                         "step_ms": round(1e3 * decode_s / steps, 2),
                         "grammar_ms_per_step": round(1e3 * grammar_s[0] / steps, 3),
                         "grammar_share": round(grammar_s[0] / decode_s, 4), "valid": f"{valid}/{len(outs)}"}
    results["identical_on_off"] = outputs["on"] == outputs["off"]
    results["speedup"] = round(results["on"]["tokens_per_s"] / results["off"]["tokens_per_s"], 3)
    print(json.dumps({"model": args.model, "docs": args.docs, "batch": args.batch, **results}))
    return 0
