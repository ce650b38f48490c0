"""CPU float32 kernels side by side: the linear layers' streaming kernel (``native/matmul.c``) against
oneDNN, or (``--compare attention``) the native attention (``native/attention.c``) against SDPA.

Two measurements, both backends interleaved round by round in one process, medians:

- ``products``: every linear layer of the model (as the lean forward calls them: q/k/v and gate/up
  fused, then o and down, then the LM head) on ``--rows`` rows, back to back: what a forward's
  matmuls cost alone.
- ``forwards``: the runner's forward over B sequences x rows at ``--contexts`` cached tokens, and a
  forward carrying a 128-token prompt chunk with 8 one-row sequences, which keeps the logits the
  engine keeps (the step's rows and the chunk's last row): what a step costs. The model
  is loaded once per linear backend; the attention backends share one model (the setting is read
  at every forward), and the products, which they do not touch, are skipped.

Examples: python -m tools bench-linear --json out/linear.json
          python -m tools bench-linear --compare attention --json out/attention.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from lookupspec.commands.common import positive_int

__all__ = ["configure", "run"]

COMPARISONS = {"linear": ("onednn", "stream"), "attention": ("sdpa", "native")}
_NAMES = {"onednn": "oneDNN", "stream": "stream", "sdpa": "SDPA", "native": "native"}


def _ints(text: str) -> list[int]:
    return [positive_int(x) for x in text.split(",") if x.strip()]


def _pairs(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        b, _, r = item.strip().partition("x")
        out.append((positive_int(b), positive_int(r or "1")))
    return out


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=os.environ.get("LOOKUPSPEC_MODEL", "smollm2-135m-instruct"),
                        help="named model, Hugging Face directory or .gguf file [env LOOKUPSPEC_MODEL]")
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="linear",
                        help="linear: oneDNN vs the streaming matmul; attention: SDPA vs the native kernel")
    parser.add_argument("--rows", type=_ints, default=[1, 2, 4, 8, 12, 16, 24, 32, 64, 128],
                        help="products: rows per product")
    parser.add_argument("--steps", type=_pairs,
                        default=[(1, 1), (1, 4), (1, 8), (8, 1), (8, 2), (8, 4), (16, 1)],
                        help="forwards: sequences x rows each, comma-separated (1x1,8x2,...)")
    parser.add_argument("--contexts", type=_ints, default=[150, 800], help="forwards: cached tokens")
    parser.add_argument("--rounds", type=positive_int, default=9, help="interleaved rounds (+1 warm-up)")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch intra-op threads")
    parser.add_argument("--json", type=Path, default=None, help="write the medians here")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load(model: str, backend: str | None) -> Any:
    from lookupspec.engine import Engine
    from lookupspec.models import load_model
    from lookupspec.runtime import prepare_models

    if backend is not None:
        os.environ["LOOKUPSPEC_CPU_LINEAR"] = backend
    loaded = load_model(model, auto_pull=True)
    prepare_models(loaded.model)
    engine = Engine(loaded.model, prefill_chunk=128)
    if engine.runner.lean is None:
        raise SystemExit(f"{model}: bench-linear needs a model that the lean forward serves "
                         "(llama, qwen2, mistral)")
    return loaded, engine


def _products(engine: Any, rows: int, inputs: dict[int, Any]) -> float:
    lean = engine.runner.lean
    t0 = time.perf_counter()
    for layer in lean.layers:
        layer.qkv(inputs[layer.o_proj.in_features][:rows])
        layer.o_proj(inputs[layer.o_proj.in_features][:rows])
        layer.gate_up(inputs[layer.down.out_features][:rows])
        layer.down(inputs[layer.down.in_features][:rows])
    lean.lm_head(inputs[lean.lm_head.in_features][:rows])
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> int:
    import torch

    from lookupspec.runtime import SeqRows

    if args.threads:
        torch.set_num_threads(args.threads)
    backends = COMPARISONS[args.compare]
    engines = {}
    if args.compare == "linear":
        for backend in backends:
            _log(f"loading {args.model} with {backend} linear layers ...")
            loaded, engines[backend] = _load(args.model, backend)
    else:
        from lookupspec.runtime.native import attention as native_attention

        os.environ["LOOKUPSPEC_CPU_ATTENTION"] = "native"
        native_attention.kernel()  # built now, or an error now
        _log(f"loading {args.model} ...")
        loaded, engine = _load(args.model, None)
        engines = {be: engine for be in backends}
    tokenizer = loaded.tokenizer
    text = " ".join(f"Passage {i}: the quick brown fox jumps over the lazy dog." for i in range(300))
    ids = tokenizer(text)["input_ids"]
    width = max(args.contexts) + 140
    if len(ids) < width:
        raise SystemExit(f"the benchmark text is {len(ids)} tokens, needs {width}")
    gen = torch.Generator().manual_seed(0)
    features = {f for e in engines.values() for lyr in e.runner.lean.layers
                for f in (lyr.o_proj.in_features, lyr.down.in_features, lyr.down.out_features)}
    features.add(engines[backends[1]].runner.lean.lm_head.in_features)
    inputs = {f: torch.randn(max(args.rows), f, generator=gen) for f in features}
    slots: dict[str, dict[int, list[Any]]] = {}
    for backend, engine in engines.items():
        runner = engine.runner
        slots[backend] = {}
        for ctx in args.contexts:
            need = max([b for b, _ in args.steps] + [9])
            slots[backend][ctx] = [runner.allocate(ctx + 140) for _ in range(need)]
            for s in slots[backend][ctx]:
                for i in range(0, ctx, 128):
                    runner.prefill(s, ids[i:min(ctx, i + 128)])
    configs: list[tuple[Any, ...]] = [("products", r) for r in args.rows] if args.compare == "linear" else []
    configs += [("forward", ctx, b, r) for ctx in args.contexts for b, r in args.steps]
    configs += [("chunk", max(args.contexts), 8)]
    times: dict[tuple[str, tuple], list[float]] = {(be, c): [] for be in backends for c in configs}
    with torch.inference_mode():
        for rnd in range(args.rounds + 1):
            for c in configs:
                for be in backends if rnd % 2 else backends[::-1]:
                    engine = engines[be]
                    if args.compare == "attention":
                        os.environ["LOOKUPSPEC_CPU_ATTENTION"] = be
                    if c[0] == "products":
                        dt = _products(engine, c[1], inputs)
                    else:
                        ctx = c[1]
                        sl = slots[be][ctx]
                        keep = None
                        if c[0] == "chunk":
                            seqs = [SeqRows(sl[i], ids[ctx + 1: ctx + 2]) for i in range(c[2])]
                            seqs.append(SeqRows(sl[c[2]], ids[ctx: ctx + 128]))
                            # as the engine: no LM head over the chunk's other 127 rows (~14% of it)
                            keep = torch.tensor([*range(c[2]), c[2] + 127], device=engine.runner.device)
                        else:
                            seqs = [SeqRows(sl[i], ids[ctx: ctx + c[3]]) for i in range(c[2])]
                        t0 = time.perf_counter()
                        engine.runner.forward(seqs, keep)
                        dt = time.perf_counter() - t0
                        for s in seqs:
                            engine.runner.pool.truncate(s.slot, ctx)
                    if rnd:
                        times[(be, c)].append(dt)
            _log(f"round {rnd}/{args.rounds} done")
    rows = []
    for c in configs:
        med = {be: statistics.median(times[(be, c)]) * 1000 for be in backends}
        if c[0] == "products":
            what = f"products, {c[1]} rows"
        elif c[0] == "forward":
            what = f"forward, {c[2]} seqs x {c[3]} rows, {c[1]} cached"
        else:
            what = f"forward, 128-token chunk + {c[2]} one-row seqs, {c[1]} cached"
        a, b = backends
        rows.append({"what": what, f"{a}_ms": round(med[a], 2), f"{b}_ms": round(med[b], 2),
                     "speedup": round(med[a] / med[b], 2)})
    a, b = (_NAMES[be] for be in backends)
    print(f"\n| measured | {a} ms | {b} ms | {a} / {b} |\n|---|---:|---:|---:|")
    for r in rows:
        ta, tb = r[backends[0] + "_ms"], r[backends[1] + "_ms"]
        print(f"| {r['what']} | {ta:.1f} | {tb:.1f} | {r['speedup']:.2f}x |")
    if args.json is not None:
        import platform

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "model": args.model,
            "compare": args.compare,
            "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "rounds": args.rounds, "rows": rows}, indent=2) + "\n")
        _log(f"wrote {args.json}")
    return 0
