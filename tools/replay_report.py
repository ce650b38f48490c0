"""The batched ``bench-replay``: its cost source, the grid of batch sizes x policies, the table and the
JSON. The replay itself is :mod:`tools.batched_replay`; the cost fit
:mod:`tools.replay_costs`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from tools.batched_replay import BatchPolicy, BatchReplay, ReplayItem, replay_batch
from tools.replay_costs import COEFFICIENTS, CostFit, CostSample, cost_model, fit_coefficients

__all__ = ["batch_rows", "run_batches"]

ESTIMATE_NOTE = ("estimates: every step's time is the step-cost model's prediction for its shape, not a "
                 "measurement; drafting and prefill time are not counted; 'full-batch steps' leaves out "
                 "the drain at the end of the file")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _measure(loaded: Any, args: argparse.Namespace,
             items: list[ReplayItem]) -> tuple[CostFit, list[CostSample]]:
    from lookupspec.engine import Engine
    from lookupspec.runtime import prepare_models
    from tools.replay_costs import measure_samples

    prepare_models(loaded.model, packed_linear=args.packed_linear)
    batches = sorted({1, *args.batch_sizes})
    engine = Engine(loaded.model, context_window=loaded.context_window, lean=args.lean_forward,
                    max_slots=max(64, batches[-1]))
    top = loaded.context_window - max(args.cost_rows) - 8
    contexts = sorted({min(c, top) for c in args.cost_contexts})
    _log(f"measuring step costs: batch {batches} x rows {args.cost_rows} at contexts {contexts}, "
         f"{args.cost_rounds} rounds ...")
    tokens = max((it.prompt for it in items), key=len)
    samples = measure_samples(engine, tokens, batches, args.cost_rows, contexts, args.cost_rounds)
    return fit_coefficients(samples), samples


def batch_rows(items: list[ReplayItem], batch_sizes: list[int], policies: list[BatchPolicy],
               fit: CostFit, log: Any = _log) -> list[dict[str, Any]]:
    """One result row per (batch size, policy), plain first at each batch size (the reference)."""
    model = cost_model(fit)
    rows = []
    for b in batch_sizes:
        plain: BatchReplay | None = None
        for policy in [BatchPolicy("plain"), *[p for p in policies if p.kind != "plain"]]:
            t0 = time.perf_counter()
            r = replay_batch(items, b, policy, model)
            plain = plain or r
            full = r.full_tokens_per_s / plain.full_tokens_per_s if plain.full_tokens_per_s else None
            rows.append({"batch": b, "policy": r.policy, "tokens_per_s": round(r.tokens_per_s, 2),
                         "speedup_vs_plain": round(r.tokens_per_s / plain.tokens_per_s, 3),
                         "full_batch_tokens_per_s": round(r.full_tokens_per_s, 2),
                         "full_batch_speedup_vs_plain": None if full is None else round(full, 3),
                         "acceptance_length": round(r.acceptance_length, 3),
                         "nodes_per_sequence_step": round(r.nodes_per_sequence_step, 3),
                         "steps": r.steps, "full_batch_steps": r.full_steps, "tokens": r.tokens,
                         "seconds": round(r.seconds, 4)})
            log(f"B={b} {r.policy}: {r.tokens_per_s:.1f} tok/s (est.), {time.perf_counter() - t0:.1f} s")
    return rows


def _describe(fit: CostFit, source: str) -> str:
    ms = {k: 1000 * v for k, v in fit.coefficients.items()}
    text = (f"step-cost model ({source}), ms: t0 {ms['t0']:.3f}, t_seq {ms['t_seq']:.3f}, t_row "
            f"{ms['t_row']:.3f}, t_kv {ms['t_kv']:.3f} and t_att {ms['t_att']:.3f} per 1000 cached positions")
    if source != "given":
        text += f"; largest fit error {fit.max_error:.0%}"
        if not fit.context_terms:
            text += "; one context measured: costs taken as independent of context"
    return text


def run_batches(args: argparse.Namespace, items_in: list[tuple[str, list[int], list[int]]],
                policies: list[BatchPolicy], costs: tuple[CostFit, list[CostSample]] | None,
                loaded: Any) -> int:
    """``costs``: the fit and the samples it came from (none for given coefficients); None: measure
    them on ``loaded`` (the model)."""
    items = [ReplayItem(kind, tuple(prompt), tuple(out)) for kind, prompt, out in items_in]
    source = "given" if args.step_cost else f"fitted to {args.costs_from}" if args.costs_from else "measured"
    fit, samples = costs if costs is not None else _measure(loaded, args, items)
    print(_describe(fit, source))
    print(f"{len(items)} prompts, continuous batching; {ESTIMATE_NOTE}.")
    rows = batch_rows(items, args.batch_sizes, policies, fit)
    print("\n| batch | policy | est. tokens/s | vs plain | vs plain, full-batch steps | acceptance length "
          "| nodes / seq / step | steps | full-batch steps |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        full = r["full_batch_speedup_vs_plain"]
        print(f"| {r['batch']} | {r['policy']} | {r['tokens_per_s']:.1f} | {r['speedup_vs_plain']:.2f}x | "
              f"{'-' if full is None else f'{full:.2f}x'} | {r['acceptance_length']:.2f} | "
              f"{r['nodes_per_sequence_step']:.2f} | {r['steps']} | {r['full_batch_steps']} |")
    if args.json is not None:
        result = {
            "mode": "batch", "from": str(args.source), "model": args.model, "prompts": len(items),
            "note": ESTIMATE_NOTE, "cost_source": source,
            "coefficients_ms": {k: round(1000 * fit.coefficients[k], 6) for k in COEFFICIENTS},
            "cost_contexts": list(fit.contexts), "cost_fit_max_error": round(fit.max_error, 4),
            "cost": [{"batch": s.batch, "rows": s.rows, "context": s.context,
                      "ms": round(1000 * s.seconds, 3)} for s in samples],
            "results": rows,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        _log(f"wrote {args.json}")
    return 0
