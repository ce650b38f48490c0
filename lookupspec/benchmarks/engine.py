"""End-to-end decode benchmark: the lookupspec engine against Hugging Face generate (greedy, PLD,
assisted) on a prompt file, in one process, interleaved prompt by prompt, greedy, batch 1.

A prompt with a ``response_format`` (``fixtures/bench/extraction.jsonl``) is decoded under its
grammar by the lookupspec systems; the HF peers cannot constrain their output, so they skip it, and
its exactness reference is ``lookupspec-plain`` (constrained decoding without speculation) instead
of ``hf-greedy``. Every such output is validated against its schema (``valid`` in the rows and the
summary).

Prints a markdown summary per prompt kind (median tokens/s, median speedups, tokens per target
forward, acceptance length against the copy oracle, exactness against plain greedy); --json writes
every measurement with the generated token ids and a machine header, --plot a bar chart.

Example: lookupspec bench --limit 8 --json bench.json --plot bench.png
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lookupspec.benchmarks.prompts import DEFAULT_PROMPTS, BenchPrompt
from lookupspec.commands.common import add_model_arguments, non_negative_int, positive_int

__all__ = ["DEFAULT_SYSTEMS", "configure", "run"]

DEFAULT_SYSTEMS = "lookupspec,lookupspec-plain,hf-greedy,hf-pld,hf-assisted"
REFERENCE = "hf-greedy"  # exactness and the copy oracle are measured against its output
CONSTRAINED_REFERENCE = "lookupspec-plain"  # ... on prompts with a response_format
WARMUP_TOKENS = 32  # warm-up generations are capped at this many tokens: enough to reach steady state
# Warm-up runs on a prompt outside the measured set, so that no system (lookupspec's output cache
# included) has seen a measured prompt or its answer before it is timed.
WARMUP_MESSAGES = ({"role": "system", "content": "You are a helpful assistant."},
                   {"role": "user", "content": "Summarize this text in two sentences.\n\n"
                    + (__doc__ or "A decode benchmark against Hugging Face generate.")})


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS,
                        help="JSONL prompt file, rows {id, kind, messages[, response_format]} "
                             "(fixtures/bench/extraction.jsonl: structured extraction; --max-tokens 512)")
    add_model_arguments(parser)
    parser.add_argument("--draft-model", default=None,
                        help="draft model for lookupspec and hf-assisted: same tokenizer, "
                             "or self:layers=K / self:int8 derived from the target")
    parser.add_argument("--max-tokens", type=positive_int, default=128, help="new tokens per prompt")
    parser.add_argument("--systems", type=_csv, default=DEFAULT_SYSTEMS,
                        help="comma-separated systems to run (hf-greedy always runs: it is the reference)")
    parser.add_argument("--kinds", type=_csv, default=None, help="comma-separated prompt kinds (None: all)")
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="at most N prompts, taken round-robin across kinds (None: all)")
    parser.add_argument("--warmup", type=non_negative_int, default=1,
                        help="untimed warm-up generations per system (on a prompt outside the set)")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch intra-op threads (None: torch's choice)")
    parser.add_argument("--json", type=Path, default=None, help="write all rows and the summary here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG chart here")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _systems(args: argparse.Namespace, notes: list[str], constrained: int, total: int) -> list[str] | None:
    """The systems to run, given how many of the ``total`` prompts carry a response_format."""
    from lookupspec.benchmarks.systems import HF_SYSTEMS, SYSTEMS

    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        _log(f"error: unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
        return None
    systems = list(dict.fromkeys(args.systems))
    if constrained:
        if CONSTRAINED_REFERENCE not in systems:
            systems.append(CONSTRAINED_REFERENCE)
            notes.append(f"{CONSTRAINED_REFERENCE} added: it is the exactness reference of prompts with a "
                         "response_format")
        peers = [s for s in systems if s in HF_SYSTEMS]
        if constrained == total:
            systems = [s for s in systems if s not in HF_SYSTEMS]
            if peers:
                notes.append(f"{', '.join(peers)} skipped: Hugging Face generate cannot constrain its output "
                             "to a response_format, and every prompt has one")
            return systems
        if peers:
            notes.append(f"{', '.join(peers)} run only on the {total - constrained} prompts without a "
                         "response_format (generate cannot constrain its output to one)")
    if REFERENCE not in systems:
        systems.insert(0, REFERENCE)
        notes.append(f"{REFERENCE} added: it is the exactness reference")
    if "hf-assisted" in systems and args.draft_model is None:
        systems.remove("hf-assisted")
        notes.append("hf-assisted skipped: it needs --draft-model")
    return systems


def _checkers(path: Path, prompts: Sequence[BenchPrompt]) -> dict[str, Any]:
    """Prompt id -> the check of its outputs, for the prompts with a response_format. Raises
    ``ValueError`` naming the row whose schema is not a valid JSON schema."""
    from lookupspec.benchmarks.validity import output_checker

    out = {}
    for p in prompts:
        try:
            check = output_checker(p.response_format)
        except ValueError as exc:
            raise ValueError(f"{path} ({p.id}): response_format: {exc}") from None
        if check is not None:
            out[p.id] = check
    return out


def _grammars(path: Path, prompts: Sequence[BenchPrompt], target: Any, eos: Sequence[int],
              vocab_size: int) -> dict[str, Any]:
    """Prompt id -> its ``LogitsParams`` (the grammar of its response_format), compiled for the target's
    tokenizer. Raises ``ValueError`` naming the row whose schema the grammar library refuses."""
    from lookupspec.constraints import GrammarCompiler, GrammarError, GrammarSpec
    from lookupspec.logits import LogitsParams

    if not prompts:
        return {}
    compiler = GrammarCompiler(target.tokenizer, vocab_size, eos)
    out = {}
    for p in prompts:
        rf = p.response_format
        assert rf is not None
        try:
            js = rf.get("json_schema", {})
            spec = (GrammarSpec.json_object() if rf["type"] == "json_object" else
                    GrammarSpec.json_schema(js["schema"], bool(js.get("strict"))))
            out[p.id] = LogitsParams(grammar=compiler.compile(spec))
        except GrammarError as exc:
            raise ValueError(f"{path} ({p.id}): response_format: {exc}") from None
    return out


def run(args: argparse.Namespace) -> int:
    from lookupspec.benchmarks.prompts import load_prompts, select_prompts
    from lookupspec.benchmarks.report import missing_matplotlib

    notes: list[str] = []
    problem = missing_matplotlib(args.plot)
    if problem:
        _log(f"error: {problem}")
        return 2
    try:
        prompts = select_prompts(load_prompts(args.prompts), args.kinds, args.limit)
        checkers = _checkers(args.prompts, prompts)
    except (OSError, ValueError, ImportError) as exc:
        _log(f"error: {exc}")
        return 2
    systems = _systems(args, notes, len(checkers), len(prompts))
    if systems is None:
        return 2
    for note in notes:
        _log(f"note: {note}")

    import torch
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    from lookupspec.benchmarks.oracle import copy_oracle
    from lookupspec.benchmarks.report import machine_info, markdown_summary, plot_summary, summarize
    from lookupspec.benchmarks.systems import (
        HF_SYSTEMS,
        LOOKUPSPEC_SYSTEMS,
        ForwardCounter,
        HFSystem,
        LookupspecSystem,
    )
    from lookupspec.drafting.derived import derive_draft, is_derived_spec
    from lookupspec.models import ModelLoadError, check_same_tokenizer, eos_token_ids, load_model, render_chat

    if args.threads:
        torch.set_num_threads(args.threads)
    # generate's deprecation and configuration notices would interleave with the progress bar.
    hf_logging.set_verbosity_error()
    try:
        target = load_model(args.model, dtype=args.dtype, device=args.device, auto_pull=True, log=_log)
        draft = None
        if args.draft_model and is_derived_spec(args.draft_model):
            draft = dataclasses.replace(target, model=derive_draft(target.model, args.draft_model),
                                        name=args.draft_model)
        elif args.draft_model:
            draft = load_model(args.draft_model, dtype=args.dtype, device=args.device, auto_pull=True,
                               log=_log)
            check_same_tokenizer(target.tokenizer, draft.tokenizer)
    except (ModelLoadError, ValueError) as exc:
        _log(f"error: {exc}")
        return 2
    eos = eos_token_ids(target)
    counter = ForwardCounter(target.model)
    runners: dict[str, Any] = {}
    for name in systems:
        runners[name] = (LookupspecSystem(target, draft, eos, name, packed_linear=args.packed_linear,
                                          lean_forward=args.lean_forward, cuda_graphs=args.cuda_graphs)
                         if name in LOOKUPSPEC_SYSTEMS
                         else HFSystem(name, target, eos, counter, draft))
    try:
        grammars = _grammars(args.prompts, [p for p in prompts if p.id in checkers], target, eos,
                             runners[CONSTRAINED_REFERENCE].vocab_size if checkers else 0)
    except ValueError as exc:
        _log(f"error: {exc}")
        return 2

    rendered: list[tuple[Any, list[int]]] = []
    for p in prompts:
        ids = render_chat(target.tokenizer, p.messages)
        if len(ids) + args.max_tokens > target.context_window:
            notes.append(f"{p.id} skipped: {len(ids)} prompt tokens + {args.max_tokens} new tokens exceed "
                         f"the context window ({target.context_window})")
            _log(f"note: {notes[-1]}")
            continue
        rendered.append((p, ids))
    if not rendered:
        _log("error: no prompt to run")
        return 2

    _log(f"bench: {len(rendered)} prompts x {', '.join(systems)}; model {target.name} ({args.dtype}, "
         f"{torch.get_num_threads()} threads), max {args.max_tokens} new tokens")
    warm_ids = render_chat(target.tokenizer, WARMUP_MESSAGES)
    for _ in range(args.warmup):
        for runner in runners.values():
            runner.generate(warm_ids, min(args.max_tokens, WARMUP_TOKENS))

    rows: list[dict[str, Any]] = []
    prompt_info: list[dict[str, Any]] = []
    started = time.perf_counter()
    bar = tqdm(rendered, desc="bench", unit="prompt", file=sys.stderr, dynamic_ncols=True)
    for p, ids in bar:
        mine: list[dict[str, Any]] = []
        check = checkers.get(p.id)
        for name, runner in runners.items():
            if check is not None and name in HF_SYSTEMS:
                continue  # generate cannot constrain its output
            r = (runner.generate(ids, args.max_tokens, grammars[p.id]) if check is not None
                 else runner.generate(ids, args.max_tokens))
            row: dict[str, Any] = {
                "id": p.id, "kind": p.kind, "system": name, "prompt_tokens": len(ids),
                "seconds": round(r.seconds, 6), "new_tokens": len(r.tokens),
                "tokens_per_s": round(len(r.tokens) / r.seconds, 4) if r.seconds > 0 else None,
                "target_forwards": r.target_forwards, "tokens": r.tokens,
            }
            if r.stats is not None:
                row["stats"] = r.stats
            if check is not None:
                why = check(target.tokenizer.decode(r.tokens, skip_special_tokens=True))
                row["valid"] = why is None
                if why is not None:
                    cut = len(r.tokens) >= args.max_tokens
                    row["invalid"] = f"cut by --max-tokens {args.max_tokens}" if cut else why
            mine.append(row)
        ref_system = REFERENCE if check is None else CONSTRAINED_REFERENCE
        reference = next(row["tokens"] for row in mine if row["system"] == ref_system)
        for row in mine:
            row["exact"] = row["tokens"] == reference
        oracle = copy_oracle(ids, reference)
        prompt_info.append({"id": p.id, "kind": p.kind, "prompt_tokens": len(ids), "reference": ref_system,
                            "response_format": p.response_format,
                            "reference_tokens": len(reference),
                            "copy_oracle": None if oracle.value is None else round(oracle.value, 4),
                            "copy_oracle_steps": oracle.steps})
        rows.extend(mine)
        bar.set_postfix_str(" ".join(f"{row['system']} {row['tokens_per_s'] or 0:.1f}" for row in mine))
    bar.close()
    counter.remove()
    elapsed = time.perf_counter() - started

    oracles = {info["id"]: info["copy_oracle"] for info in prompt_info}
    summary = summarize(rows, oracles, systems)
    summary["elapsed_s"] = round(elapsed, 2)
    mismatched = [f"{r['id']} ({r['system']})" for r in rows if not r["exact"]]
    if mismatched:
        notes.append("not exact against the reference (hf-greedy; lookupspec-plain for a response_format): "
                     + ", ".join(mismatched))
        _log(f"warning: {notes[-1]}")
    invalid = [f"{r['id']} ({r['system']}): {r['invalid']}" for r in rows if r.get("valid") is False]
    if invalid:
        notes.append("outputs that do not follow their response_format: " + "; ".join(invalid))
        _log(f"warning: {notes[-1]}")
    print(markdown_summary(summary, systems))
    print(f"\n{len(rendered)} prompts, {args.max_tokens} max new tokens, {elapsed:.0f} s measured.")

    config = {"prompts": str(args.prompts), "model": target.name, "model_path": str(target.path),
              "draft_model": None if draft is None else draft.name, "dtype": args.dtype,
              "device": args.device, "max_tokens": args.max_tokens, "systems": systems,
              "kinds": args.kinds, "limit": args.limit, "warmup": args.warmup,
              "constrained_prompts": len(checkers),
              "eos_token_ids": list(eos), "argv": sys.argv}
    info = machine_info()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        result = {"machine": info, "config": config, "notes": notes, "summary": summary,
                  "prompts": prompt_info, "rows": rows}
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        _log(f"wrote {args.json}")
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        title = (f"lookupspec bench: {target.name} {args.dtype}, greedy, {args.max_tokens} new tokens, "
                 f"{len(rendered)} prompts\n{info['cpu']}, threads: {info['torch_threads']}, "
                 f"{info['date'][:10]}")
        plot_summary(summary, systems, args.plot, title)
        _log(f"wrote {args.plot}")
    return 0
