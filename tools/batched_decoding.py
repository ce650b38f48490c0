"""Batched-runtime benchmark: what a step costs against batch size and rows, what B sequences decode
together, and whether a sequence's output depends on its batch.

Four sections (``--sections``, all by default), on the default model and prompt file:

- ``cost``: the wall time of one target forward over B sequences (1, 2, 4, 8, 16) x rows per
  sequence (1, 4, 8, 16) at ~1000-token contexts, configurations interleaved round by round, medians.
  With ``--compare-lean-native`` each shape is timed with the lean forward's native element-wise
  steps and with torch's ops, one after the other in every round, and the ratio is printed.
- ``throughput``: aggregate decode tokens/s of B sequences stepping together (the prompts run in
  waves of B; prefill untimed), plain decoding and with their lookup drafts, against one sequence
  alone on the same prompts.
- ``noise``: how far a position's logits move between the runtime's forward paths (a one-row step,
  a row of a draft chain or tree, among other sequences, the last row of a prefill) on the first
  ``--noise-prompts`` prompts (:mod:`tools.path_noise`): 0 where every path gives
  the same bits (the CPU's float32 runtime).
- ``exactness``: every prompt generated greedy and with seeded sampling (temperature 0.8) in batches
  of 1, 4 and 8 with speculation on (and plain in batches of 8); each output compared with its
  batch-of-one output. At the first differing position of a pair, the two candidate tokens' scores
  (logits for greedy; processed logits plus the position's Gumbel noise for sampling) are
  recomputed by a batch-of-one forward: a difference under the near-tie epsilon is a float near-tie,
  any other is a bug. The epsilon, in logits, is ``--epsilon`` or, where the noise section ran and
  found more, twice the largest difference it measured (each candidate's logit may move that much
  between paths); for sampling it is divided by the temperature, as the scores are.

Example: python -m tools bench-batch --limit 16 --json out/batch.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from lookupspec.benchmarks.prompts import DEFAULT_PROMPTS
from lookupspec.commands.common import add_model_arguments, positive_int
from tools.path_noise import dtype_step

__all__ = ["configure", "run", "run_waves"]

SECTIONS = ("cost", "throughput", "noise", "exactness")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS, help="JSONL prompt file")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help="comma-separated: " + ", ".join(SECTIONS))
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="prompts for throughput and exactness (None: all), round-robin across kinds")
    parser.add_argument("--kinds", default=None, help="comma-separated prompt kinds (None: all)")
    parser.add_argument("--max-tokens", type=positive_int, default=128, help="new tokens per prompt")
    parser.add_argument("--batch-sizes", type=_ints, default=[1, 2, 4, 8, 16],
                        help="cost: sequences per step")
    parser.add_argument("--rows", type=_ints, default=[1, 4, 8, 16], help="cost: rows per sequence")
    parser.add_argument("--context", type=positive_int, default=1000, help="cost: tokens in each cache")
    parser.add_argument("--rounds", type=positive_int, default=7, help="cost: interleaved rounds")
    parser.add_argument("--compare-lean-native", action="store_true",
                        help="cost: time every shape with the lean forward's native element-wise steps and "
                             "with torch's ops, one after the other in every round (LOOKUPSPEC_LEAN_NATIVE "
                             "native, torch), and print both with their ratio")
    parser.add_argument("--throughput-batches", type=_ints, default=[1, 4, 8, 16],
                        help="throughput: batch sizes (1 is the reference)")
    parser.add_argument("--exactness-batches", type=_ints, default=[4, 8], help="exactness: batch sizes vs 1")
    parser.add_argument("--noise-prompts", type=positive_int, default=4,
                        help="noise: prompts whose logits are compared across forward paths")
    parser.add_argument("--noise-rows", type=_ints, default=[4, 16], help="noise: draft chain lengths")
    parser.add_argument("--epsilon", type=float, default=1e-3,
                        help="exactness: the near-tie epsilon in logits (raised to twice the noise "
                             "section's largest difference where that is more)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads")
    parser.add_argument("--json", type=Path, default=None, help="write every measurement here")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_waves(engine: Any, requests: list[tuple[list[int], Any]], batch: int, spec: Any,
              logits_log: dict | None = None) -> tuple[list[list[int]], float, int]:
    """Generate every request, ``batch`` at a time, stepping each wave together. Returns the outputs
    (in request order), the seconds spent in decode steps and the tokens those steps emitted."""
    outputs: list[list[int]] = [[] for _ in requests]
    decode_s, decode_tokens = 0.0, 0
    for w in range(0, len(requests), batch):
        wave = list(range(w, min(w + batch, len(requests))))
        seqs = {i: engine.start(requests[i][0], requests[i][1], spec) for i in wave}
        for i, s in seqs.items():
            first = engine.prefill(s, engine.prefill_chunk)
            while first is None:
                first = engine.prefill(s, engine.prefill_chunk)
            outputs[i].extend(first.tokens)
        while True:
            live = [i for i in wave if seqs[i].running]
            if not live:
                break
            t0 = time.perf_counter()
            outs = engine.step([seqs[i] for i in live])
            decode_s += time.perf_counter() - t0
            for i, o in zip(live, outs, strict=True):
                outputs[i].extend(o.tokens)
                decode_tokens += len(o.tokens)
    return outputs, decode_s, decode_tokens


_LEAN_NATIVE = "LOOKUPSPEC_LEAN_NATIVE"


def _cost(engine: Any, prompt_ids: list[int], args: argparse.Namespace,
          settings: tuple[str | None, ...] = (None,)) -> dict[str | None, list[dict[str, Any]]]:
    """Step costs by shape, for each LOOKUPSPEC_LEAN_NATIVE setting (None: as it is), the settings
    timed one after the other for every shape in every round."""
    import torch

    from lookupspec.runtime import SeqRows
    from lookupspec.warmup import sync_device

    runner = engine.runner
    ctx = prompt_ids[: args.context]
    nb = max(args.batch_sizes)
    slots = [runner.allocate(len(ctx) + max(args.rows) + 2) for _ in range(nb)]
    times: dict[tuple[int, int, str | None], list[float]] = {
        (b, r, v): [] for b in args.batch_sizes for r in args.rows for v in settings}
    before = os.environ.get(_LEAN_NATIVE)
    try:
        for s in slots:
            runner.prefill(s, ctx)
        with torch.inference_mode():
            for _ in range(args.rounds + 1):  # the first round warms every shape up, untimed
                for b, r, v in times:
                    if v is not None:
                        os.environ[_LEAN_NATIVE] = v
                    seqs = [SeqRows(slots[i], [ctx[-1 - j] for j in range(r)]) for i in range(b)]
                    sync_device(runner.device)
                    t0 = time.perf_counter()
                    runner.forward(seqs)
                    sync_device(runner.device)  # CUDA runs the forward asynchronously: wait for it
                    times[(b, r, v)].append(time.perf_counter() - t0)
                    for s in seqs:
                        runner.pool.truncate(s.slot, len(ctx))
    finally:
        for s in slots:
            runner.free(s)
        if before is None:
            os.environ.pop(_LEAN_NATIVE, None)
        else:
            os.environ[_LEAN_NATIVE] = before
    out: dict[str | None, list[dict[str, Any]]] = {v: [] for v in settings}
    for (b, r, v), ts in times.items():
        ms = statistics.median(ts[1:]) * 1000
        out[v].append({"batch": b, "rows": r, "total_rows": b * r, "ms": round(ms, 2),
                       "rows_per_s": round(b * r / ms * 1000, 1)})
    return out


def _throughput(engine: Any, requests: list, args: argparse.Namespace) -> list[dict[str, Any]]:
    from lookupspec.params import SpecParams

    out = []
    for label, spec in (("plain", SpecParams(enabled=False)), ("lookup", SpecParams(sources=("context",)))):
        base = None
        for b in args.throughput_batches:
            _, seconds, tokens = run_waves(engine, requests, b, spec)
            rate = tokens / seconds if seconds else 0.0
            base = rate if b == 1 else base
            row = {"drafts": label, "batch": b, "decode_tokens": tokens, "decode_s": round(seconds, 2),
                   "tokens_per_s": round(rate, 1)}
            if base:
                row["vs_batch_1"] = round(rate / base, 2)
            out.append(row)
            _log(f"throughput {label} B={b}: {rate:.1f} tok/s")
    return out


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _margin(engine: Any, prompt: list[int], reference: list[int], pos: int, other: int,
            params: Any, epsilon: float) -> tuple[float, float, bool]:
    """Score difference between the batch-of-one token and the other run's token at output index
    ``pos``, from a batch-of-one forward over the prompt and the shared prefix; the same difference
    in steps of the model's dtype at the two candidates' logit size (a float32 margin of 1e-3 is
    many steps, a bfloat16 one of 0.5 a few); and whether it is a near-tie under ``epsilon``, in
    logits (the scores of sampling are logits / T: both measures scale by 1 / T there)."""
    import torch

    from lookupspec.sampling import gumbel_noise, process_logits

    ids = prompt + reference[:pos]
    slot = engine.runner.allocate(len(ids) + 2)
    try:
        logits = engine.runner.prefill(slot, ids)
    finally:
        engine.runner.free(slot)
    sampling = params.sampling
    if sampling.greedy:
        scores, scale = logits, 1.0
    else:
        scores = process_logits(logits[None], sampling)[0] + gumbel_noise(
            sampling.seed, torch.tensor([len(ids)], device=logits.device), logits.shape[-1])[0]
        scale = 1.0 / sampling.temperature
    margin = abs(float(scores[reference[pos]] - scores[other]))
    size = max(abs(float(logits[reference[pos]])), abs(float(logits[other])))
    return margin, margin / (dtype_step(size, engine.runner.dtype) * scale), margin < epsilon * scale


def _exactness(engine: Any, requests_greedy: list, requests_sampled: list,
               args: argparse.Namespace, epsilon: float) -> list[dict[str, Any]]:
    """Batches against batch-of-one (module docstring); ``epsilon``: the near-tie bound in logits."""
    from lookupspec.params import SpecParams

    rows = []
    for label, requests, spec in (("greedy", requests_greedy, SpecParams()),
                                  ("sampled T=0.8", requests_sampled, SpecParams()),
                                  ("greedy, plain", requests_greedy, SpecParams(enabled=False))):
        alone, _, _ = run_waves(engine, requests, 1, spec)
        batches = args.exactness_batches if spec.enabled else [max(args.exactness_batches)]
        for b in batches:
            outs, _, _ = run_waves(engine, requests, b, spec)
            differ = ties = 0
            margins, steps = [], []
            for (prompt, params), ref, got in zip(requests, alone, outs, strict=True):
                pos = _first_difference(ref, got)
                if pos is None:
                    continue
                differ += 1
                if pos < min(len(ref), len(got)):
                    m, k, tie = _margin(engine, list(prompt), ref, pos, got[pos], params, epsilon)
                    margins.append(m)
                    steps.append(k)
                    ties += tie
            rows.append({"mode": label, "batch": b, "prompts": len(requests),
                         "identical": len(requests) - differ, "differ": differ, "near_ties": ties,
                         "other_differences": differ - ties,
                         "margins": [round(m, 6) for m in margins],
                         "margin_dtype_steps": [round(k, 2) for k in steps]})
            _log(f"exactness {label} B={b}: {len(requests) - differ}/{len(requests)} identical, "
                 f"{ties} near-ties, {differ - ties} other"
                 + "".join(f"; margin {m:.4g} ({k:.1f} {engine.runner.dtype} steps)"
                           for m, k in zip(margins, steps, strict=True)))
    return rows


def run(args: argparse.Namespace) -> int:
    import torch

    from lookupspec.benchmarks.prompts import load_prompts, select_prompts
    from lookupspec.text import TextEngine

    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        _log(f"error: unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] if args.kinds else None
    prompts = select_prompts(load_prompts(args.prompts), kinds, args.limit)
    _log(f"loading model {args.model} ...")
    te = TextEngine.load(args.model, dtype=args.dtype, device=args.device, packed_linear=args.packed_linear,
                         lean_forward=args.lean_forward, auto_pull=True, warmup=True, log=_log)
    engine = te.engine
    encoded = [te.encode_prompt(messages=list(p.messages)) for p in prompts]
    greedy = [(ids, te.params(max_tokens=args.max_tokens)) for ids in encoded]
    sampled = [(ids, te.params(max_tokens=args.max_tokens, temperature=0.8, seed=1000 + i))
               for i, ids in enumerate(encoded)]
    result: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
        "model": args.model, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "batch_invariant": engine.runner.batch_invariant, "prompts": len(prompts),
        "max_tokens": args.max_tokens,
    }
    started = time.perf_counter()
    if "cost" in sections:
        context = max(encoded, key=len) * (args.context // max(len(max(encoded, key=len)), 1) + 1)
        if args.compare_lean_native:
            both = _cost(engine, context, args, ("native", "torch"))
            result["cost"], result["cost_lean_native"] = both["native"], both
            _print_cost(both["native"], "with the native element-wise steps")
            _print_cost(both["torch"], "with torch's ops")
            _print_ratio(both["torch"], both["native"])
        else:
            result["cost"] = _cost(engine, context, args)[None]
            _print_cost(result["cost"])
    if "throughput" in sections:
        result["throughput"] = _throughput(engine, greedy, args)
        _print_rows("Aggregate decode throughput", result["throughput"])
    epsilon = args.epsilon
    if "noise" in sections:
        from tools.path_noise import noise_epsilon, path_noise

        result["noise"] = path_noise(engine.runner, encoded[: args.noise_prompts], args.noise_rows)
        _print_rows(f"Logits across forward paths against one row at a time ({engine.runner.dtype})",
                    result["noise"])
        epsilon = noise_epsilon(result["noise"], args.epsilon)
    if "exactness" in sections:
        result["near_tie_epsilon"] = epsilon
        _log(f"near-tie epsilon: {epsilon:.4g} in logits"
             + (" (twice the largest difference between forward paths)" if epsilon > args.epsilon else ""))
        result["exactness"] = _exactness(engine, greedy, sampled, args, epsilon)
        _print_rows("Exactness against batch-of-one",
                    [{k: v for k, v in r.items() if not k.startswith("margin")} for r in result["exactness"]])
    result["seconds"] = round(time.perf_counter() - started, 1)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        _log(f"wrote {args.json}")
    return 0


def _print_cost(rows: list[dict[str, Any]], how: str = "") -> None:
    ms = {(r["batch"], r["rows"]): r["ms"] for r in rows}
    title = "Step cost (ms) by batch size (rows) and rows per sequence (columns)"
    _print_grid(f"{title}{' ' + how if how else ''}", {k: f"{v:.1f}" for k, v in ms.items()})


def _print_ratio(slow: list[dict[str, Any]], fast: list[dict[str, Any]]) -> None:
    """Each shape's torch-ops time over its native-steps time."""
    ms_fast = {(r["batch"], r["rows"]): r["ms"] for r in fast}
    _print_grid("Speed-up of the native element-wise steps (torch ops ms / native ms)",
                {(r["batch"], r["rows"]): f"{r['ms'] / ms_fast[(r['batch'], r['rows'])]:.2f}x" for r in slow})


def _print_grid(title: str, cells: dict[tuple[int, int], str]) -> None:
    """A markdown table of ``cells[(batch, rows)]``: batch sizes down, rows per sequence across."""
    per = sorted({r for _, r in cells})
    print(f"\n{title}\n")
    print("| batch | " + " | ".join(f"{r} rows" for r in per) + " |")
    print("|---:|" + "---:|" * len(per))
    for b in sorted({b for b, _ in cells}):
        print(f"| {b} | " + " | ".join(cells[(b, r)] for r in per) + " |")


def _print_rows(title: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    keys = list(rows[0])
    print(f"\n{title}\n")
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
