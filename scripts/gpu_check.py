"""The figures and exactness checks of issue 50's GPU check (``scripts/gpu-check.sh`` runs it after
the CUDA tests; docs/gpu.md). One call, a few minutes on one GPU, JSON plus a printed summary.

For each model shape (random bfloat16 weights built on the device from ``fixtures/gpu-configs``, no
weight files) at a ~1,000-token context, three step shapes, each through three paths over one KV pool:

- ``decode_1seq``: one sequence, one row (plain decoding);
- ``tree16_1seq``: one sequence, its root and a 16-node draft tree (17 rows: the 32-row bucket);
- ``batch8x8``: eight sequences of eight rows each (a root and a 7-node tree each);

paths: ``todays_eager`` (``ModelRunner.forward``, transformers' forward with the runtime's attention),
``static_eager`` (:class:`~lookupspec.runtime.static.StaticStep`) and ``static_graph``
(:class:`~lookupspec.runtime.static.GraphStep`: replayed CUDA graphs). Each figure is the median over
``--iters`` steps of the time between CUDA events around one step (plan, upload and forward), the
device idle before each; beside it the HBM floor: the model's weight bytes over the GPU's bandwidth
(a table by GPU name, else a measured device-to-device copy).

The engine (``--engine-model``, SmolLM2's shape by default), as ``serve`` runs it (graphs where they
serve): decode tokens/s of one and of eight sequences stepped together with speculation off (issue
50's serving target: eight at least 6x one), and with speculation on, the rows a step verifies
against its bucket's rows (how the draft budget fills buckets).

Exactness (``--exact-model``, random weights of initializer range 0.25 so that greedy tokens are
rarely near ties): four sequences, prompts prefilled, then steps of decode rows and draft trees, the
next tokens forced to the reference's, through three separate pools in float32 and in bfloat16:

- the graph path against the static step run eagerly: every logit row identical, counted;
- the static step against today's path: greedy tokens equal, or a near-tie: a difference whose
  reference top-two margin is within twice the largest logit move between the paths in that run
  (the rule docs/gpu.md applies to bfloat16 path noise), counted apart from other differences.

``--dry-run`` runs it all on the CPU with the tiny shapes of the same configs (2 layers, hidden 64)
at a 48-token context in a few seconds: what CI checks. No GPU figure comes from it.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import runpy
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python scripts/gpu_check.py` from a bare checkout
    sys.path.insert(0, str(ROOT))
runpy.run_path(str(ROOT / "scripts" / "checkout_site" / "sitecustomize.py"))

import torch  # noqa: E402

CONFIGS = ROOT / "fixtures" / "gpu-configs"
MODELS = ("smollm2-135m", "llama-3.2-1b", "llama-3.1-8b")
# issue 50's targets for the plain decode step at one sequence, in ms (None: 1.4 x the HBM floor)
DECODE_TARGET_MS: dict[str, float | None] = {"smollm2-135m": 2.0, "llama-3.2-1b": 2.5, "llama-3.1-8b": None}
BANDWIDTH = (("H200", None, 4.8e12), ("H100", ("HBM3", "SXM"), 3.35e12), ("A100", ("80GB",), 2.0e12))
PATHS = ("todays_eager", "static_eager", "static_graph")
TREE16 = [-1] + [(i - 1) // 2 for i in range(1, 17)]  # a root and a binary tree of 16 nodes
TREE8 = [-1, 0, 1, 2, 0, 4, 1, 6]  # a root and 7 nodes on three branches


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def versions(device: torch.device) -> dict[str, Any]:
    import transformers

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": transformers.__version__, "cuda": torch.version.cuda}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
        out["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
    try:
        out["commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], text=True,
                                       capture_output=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        out["commit"] = None
    return out


def bandwidth(device: torch.device) -> dict[str, Any]:
    """Bytes per second of the device's memory: by GPU name, else a measured device-to-device copy
    (bytes read plus written)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, variants, bw in BANDWIDTH:
            if key in name and (variants is None or any(v in name for v in variants)):
                return {"bytes_per_s": bw, "source": f"table ({key})"}
    n = (1 << 30) if device.type == "cuda" else (1 << 24)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    sync(device)
    return {"bytes_per_s": 2 * 10 * n / (time.perf_counter() - t0), "source": "measured copy"}


def build_model(name: str, device: torch.device, dtype: torch.dtype, *, tiny: bool,
                initializer_range: float | None = None, seed: int = 0) -> Any:
    """A random-weight model of ``fixtures/gpu-configs/NAME.json``'s shape, built on the device
    (``tiny``: 2 layers of hidden size 64, for the dry run)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(CONFIGS / f"{name}.json"))
    if tiny:
        for key, value in (("hidden_size", 64), ("intermediate_size", 128), ("num_hidden_layers", 2),
                           ("num_attention_heads", 4), ("num_key_value_heads", 2), ("head_dim", 16),
                           ("vocab_size", 512)):
            setattr(cfg, key, value)
        cfg.bos_token_id = cfg.eos_token_id = cfg.pad_token_id = None
    if initializer_range is not None:
        cfg.initializer_range = initializer_range
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


class Paths:
    """Today's path, the static step eagerly and its graphs, over one runner's pool (or the first
    alone when the static step cannot serve the model: ``static_reason``)."""

    def __init__(self, model: Any, *, context_window: int, max_batch: int) -> None:
        from lookupspec.runtime import ModelRunner
        from lookupspec.runtime.static import GraphStep, StaticStep

        self.runner = ModelRunner(model, context_window=context_window, max_batch=max_batch + 1, check=False)
        self.pool = self.runner.pool
        self.static_reason = StaticStep.unsupported(model, self.pool)
        self.step = None if self.static_reason else StaticStep(model, self.pool)
        self.graphs = None if self.step is None else GraphStep(self.step, "auto")

    def why_not(self, path: str) -> str | None:
        if path != "todays_eager" and self.static_reason:
            return self.static_reason
        if path == "static_graph" and self.graphs is not None and not self.graphs.enabled:
            return self.graphs.reason
        return None

    def call(self, path: str, seqs: list[Any]) -> torch.Tensor:
        if path == "todays_eager":
            return self.runner.forward(seqs)
        assert self.step is not None and self.graphs is not None
        plan = self.step.plan(seqs)
        return self.step.run(plan) if path == "static_eager" else self.graphs.run(plan)


def time_path(paths: Paths, path: str, seqs: list[Any], *, iters: int, warmup: int,
              device: torch.device) -> dict[str, Any]:
    """Median and least ms of one step of ``seqs`` through ``path``; the slots are cut back after each."""
    lengths = [int(paths.pool.length[s.slot]) for s in seqs]
    times = []
    for i in range(warmup + iters):
        sync(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            paths.call(path, seqs)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            paths.call(path, seqs)
            ms = 1e3 * (time.perf_counter() - t0)
        for s, n in zip(seqs, lengths, strict=True):
            paths.pool.truncate(s.slot, n)
        if i >= warmup:
            times.append(ms)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "steps": len(times)}


def measure_model(name: str, args: argparse.Namespace, device: torch.device, bw: float,
                  log: Callable[[str], None]) -> dict[str, Any]:
    from lookupspec.runtime import SeqRows

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    t0 = time.perf_counter()
    model = build_model(name, device, dtype, tiny=args.dry_run)
    sync(device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    out: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch."), "build_s": time.perf_counter() - t0,
                           "params": sum(p.numel() for p in model.parameters()), "weight_bytes": weight_bytes,
                           "floor_ms": 1e3 * weight_bytes / bw, "context": args.context, "figures": {}}
    log(f"{name}: {out['params'] / 1e6:.0f}M parameters built in {out['build_s']:.1f} s; "
        f"HBM floor {out['floor_ms']:.3f} ms")
    paths = Paths(model, context_window=args.context + 64, max_batch=8)
    slots = [paths.pool.allocate(args.context + 32) for _ in range(8)]
    for s in slots:  # a ~context-token cache per sequence (its values do not change what a step costs)
        paths.pool.advance(s, args.context)
    shapes = {"decode_1seq": [SeqRows(slots[0], [7])],
              "tree16_1seq": [SeqRows(slots[0], list(range(7, 24)), TREE16)],
              "batch8x8": [SeqRows(s, list(range(7, 15)), TREE8) for s in slots]}
    for shape, seqs in shapes.items():
        row: dict[str, Any] = {}
        for path in PATHS:
            reason = paths.why_not(path)
            if reason is not None:
                row[path] = {"skipped": reason}
                continue
            try:
                row[path] = time_path(paths, path, seqs, iters=args.iters, warmup=args.warmup, device=device)
            except Exception as exc:  # one path's failure must not lose the others
                row[path] = {"error": f"{type(exc).__name__}: {exc}"}
        out["figures"][shape] = row
        log(f"  {shape}: " + ", ".join(f"{p} {_ms(row[p])}" for p in PATHS))
    out["targets"] = targets(name, out)
    del paths, model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def engine_figures(name: str, args: argparse.Namespace, device: torch.device,
                   log: Callable[[str], None]) -> dict[str, Any]:
    """The engine over the model (the static step and its graphs where they serve, as ``serve`` runs
    it): decode tokens/s of 1 and of 8 sequences stepped together, speculation off (issue 50's serving
    target: 8 at least 6x 1), and with speculation on, how the draft budget fills the buckets (rows
    per step against their bucket's rows). Prompts of ``--engine-prompt`` tokens, a random span
    repeated so that lookups find drafts; ``--engine-tokens`` new tokens each, timed over the decode
    steps (the prefill, untimed, gives each sequence its first)."""
    from lookupspec.config import EngineConfig
    from lookupspec.engine import Engine
    from lookupspec.params import GenerationParams, SpecParams

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    model = build_model(name, device, dtype, tiny=args.dry_run)
    vocab = int(model.config.vocab_size)
    # the dry run turns the static step on to run it eagerly (the CPU has no graphs): what CI can check
    window = args.engine_prompt + args.engine_tokens + 64
    engine = Engine(model, EngineConfig(max_batch=8, context_window=window,
                                        cuda_graphs="on" if args.dry_run else "auto"))
    engine.warmup(context=min(args.engine_prompt, 256))
    out: dict[str, Any] = {"static_step": engine.runner.static is not None,
                           "graphs": bool(engine.runner.static is not None and engine.runner.static.graphs),
                           "prompt_tokens": args.engine_prompt, "new_tokens": args.engine_tokens}
    ran: list[tuple[int, Any]] = []
    plan = engine.runner.plan

    def record(seqs: Any, stage: Any = None) -> Any:
        planned = plan(seqs, stage)
        ran.append((sum(len(s.tokens) for s in seqs), engine.runner.bucket_of(planned)))
        return planned

    engine.runner.plan = record  # type: ignore[method-assign]

    def decode(b: int, spec: SpecParams) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(b)
        prompts = []
        for _ in range(b):
            span = torch.randint(3, vocab, (32,), generator=gen).tolist()
            prompts.append((span * (args.engine_prompt // 32 + 1))[: args.engine_prompt])
        params = GenerationParams(max_tokens=args.engine_tokens, ignore_eos=True)
        seqs = [engine.start(p, params, spec) for p in prompts]
        for s in seqs:
            engine.prefill(s)
        del ran[:]
        sync(device)
        t0 = time.perf_counter()
        tokens, steps, live = 0, 0, list(seqs)
        while live:
            tokens += sum(len(o.tokens) for o in engine.step(live))
            steps += 1
            live = [s for s in live if s.finish_reason is None]
        sync(device)
        seconds = time.perf_counter() - t0
        for s in seqs:
            engine.release(s)
        fill = [(rows, b_.rows) for rows, b_ in ran if b_ is not None]
        return {"tokens_per_s": tokens / seconds, "tokens": tokens, "steps": steps,
                "rows_per_step": sum(r for r, _ in fill) / len(fill) if fill else None,
                "bucket_rows_per_step": sum(br for _, br in fill) / len(fill) if fill else None,
                "full_buckets": sum(r == br for r, br in fill) / len(fill) if fill else None}

    off, on = SpecParams(enabled=False), SpecParams()
    out["plain_1seq"], out["plain_8seq"] = decode(1, off), decode(8, off)
    out["spec_1seq"], out["spec_8seq"] = decode(1, on), decode(8, on)
    one, eight = out["plain_1seq"]["tokens_per_s"], out["plain_8seq"]["tokens_per_s"]
    out["serving_8_over_1"] = eight / one
    out["serving_met"] = eight >= 6 * one
    log(f"engine {name}: plain {one:.1f} / {eight:.1f} tok/s at 1 / 8 sequences ({eight / one:.2f}x); "
        f"speculation {out['spec_1seq']['tokens_per_s']:.1f} / {out['spec_8seq']['tokens_per_s']:.1f}")
    return out  # (the caller frees the model's memory)


def _ms(figure: dict[str, Any]) -> str:
    if "median_ms" in figure:
        return f"{figure['median_ms']:.3f} ms"
    return "skipped" if "skipped" in figure else "error"


def targets(name: str, result: dict[str, Any]) -> dict[str, Any]:
    """Issue 50's targets against the graph path's figures (None where a figure is missing)."""

    def med(shape: str) -> float | None:
        return result["figures"].get(shape, {}).get("static_graph", {}).get("median_ms")

    decode, tree, batch = med("decode_1seq"), med("tree16_1seq"), med("batch8x8")
    limit = DECODE_TARGET_MS.get(name)
    limit = 1.4 * result["floor_ms"] if limit is None else limit
    return {"decode_ms_limit": limit, "decode_met": None if decode is None else decode <= limit,
            "tree16_over_decode": None if tree is None or not decode else tree / decode,
            "tree16_met": None if tree is None or not decode else tree <= 1.15 * decode,
            "batch8x8_over_decode": None if batch is None or not decode else batch / decode,
            "batch8x8_met": None if batch is None or not decode else batch <= 1.5 * decode}


def exactness(name: str, dtype: torch.dtype, args: argparse.Namespace,
              device: torch.device) -> dict[str, Any]:
    """The graph path against the static step, and the static step against today's path (module
    docstring), on separate pools, with the reference's tokens forced on all three."""
    from lookupspec.runtime import SeqRows

    model = build_model(name, device, dtype, tiny=args.dry_run, initializer_range=0.25)
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (60, 100, 35, 80)]
    sets = {p: Paths(model, context_window=256, max_batch=4) for p in PATHS}
    if sets["static_eager"].static_reason:
        return {"skipped": sets["static_eager"].static_reason}
    slots = {p: [s.pool.allocate(200) for _ in prompts] for p, s in sets.items()}
    logits: dict[str, list[torch.Tensor]] = {p: [] for p in PATHS}
    for p, paths in sets.items():
        for slot, prompt in zip(slots[p], prompts, strict=True):
            logits[p].append(paths.call(p, [SeqRows(slot, prompt)])[-1:].float().cpu())
    tokens = [int(x.argmax()) for x in logits["todays_eager"]]
    for k in range(args.exact_steps):
        drafts = torch.randint(3, vocab, (len(prompts), 4), generator=gen).tolist()
        for p, paths in sets.items():
            seqs = [SeqRows(s, [t, *d], [-1, 0, 0, 1, 2]) if (k + i) % 2 else SeqRows(s, [t])
                    for i, (s, t, d) in enumerate(zip(slots[p], tokens, drafts, strict=True))]
            logits[p].append(paths.call(p, seqs).float().cpu())
            for s in seqs:  # every draft rejected: the root stays
                paths.pool.truncate(s.slot, int(paths.pool.length[s.slot]) - len(s.tokens) + 1)
        ref, row = logits["todays_eager"][-1], 0
        for i in range(len(prompts)):  # the next root: the reference's choice after this root
            tokens[i] = int(ref[row].argmax())
            row += 5 if (k + i) % 2 else 1
    ref, eager, graph = (torch.cat(logits[p]) for p in PATHS)
    same_rows = int((graph == eager).all(dim=1).sum())
    move = float((eager - ref).abs().max())
    differ = eager.argmax(1) != ref.argmax(1)
    top2 = ref.topk(2, dim=1).values
    near = differ & ((top2[:, 0] - top2[:, 1]) <= 2 * move)
    graph_vs_eager = {"identical_rows": same_rows, "max_abs_diff": float((graph - eager).abs().max()),
                      "token_differences": int((graph.argmax(1) != eager.argmax(1)).sum()),
                      "graph": sets["static_graph"].why_not("static_graph") or "replayed"}
    static_vs_todays = {"max_abs_diff": move, "token_differences": int(differ.sum()),
                        "near_ties": int(near.sum()), "other_differences": int((differ & ~near).sum())}
    return {"rows": int(ref.shape[0]), "graph_vs_eager": graph_vs_eager, "static_vs_todays": static_vs_todays}


def summary(result: dict[str, Any]) -> list[str]:
    v, bw = result["versions"], result["bandwidth"]
    lines = [f"GPU check: {v.get('gpu', result['device'])}, torch {v['torch']}, triton {v['triton']}, "
             f"transformers {v['transformers']}; "
             f"bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s ({bw['source']})"]
    for name, m in result["models"].items():
        if "error" in m:
            lines.append(f"{name}: ERROR {m['error']}")
            continue
        lines.append(f"{name} ({m['dtype']}, context {m['context']}): HBM floor {m['floor_ms']:.3f} ms")
        for shape, row in m["figures"].items():
            lines.append(f"  {shape:12s} " + "  ".join(f"{p} {_ms(row[p]):>10s}" for p in PATHS))
        t = m["targets"]
        lines.append(f"  targets (graph path): decode <= {t['decode_ms_limit']:.2f} ms: {t['decode_met']}; "
                     f"tree16 <= 1.15x decode: {t['tree16_met']}; 8x8 <= 1.5x decode: {t['batch8x8_met']}")
    e = result.get("engine")
    if e is not None and "error" in e:
        lines.append(f"engine: ERROR {e['error']}")
    elif e is not None:
        p1, p8 = e["plain_1seq"], e["plain_8seq"]
        lines.append(f"engine (static step {e['static_step']}, graphs {e['graphs']}): plain "
                     f"{p1['tokens_per_s']:.1f} / {p8['tokens_per_s']:.1f} tok/s at 1 / 8 sequences, "
                     f"{e['serving_8_over_1']:.2f}x (target >= 6x: {e['serving_met']})")
        for key in ("spec_1seq", "spec_8seq"):
            f = e[key]
            fill = ("" if f["rows_per_step"] is None else
                    f", {f['rows_per_step']:.1f} rows a step in buckets of {f['bucket_rows_per_step']:.1f}, "
                    f"{100 * f['full_buckets']:.0f}% of steps filling theirs")
            per_step = f["tokens"] / f["steps"]
            lines.append(f"  {key}: {f['tokens_per_s']:.1f} tok/s, {per_step:.2f} tokens a step{fill}")
    for dtype, e in result.get("exactness", {}).items():
        if "rows" not in e:
            lines.append(f"exactness {dtype}: {e}")
            continue
        g, s = e["graph_vs_eager"], e["static_vs_todays"]
        lines.append(f"exactness {dtype} ({e['rows']} rows): graph = eager on {g['identical_rows']} rows "
                     f"({g['graph']}); static vs today's: {s['token_differences']} token differences, "
                     f"{s['near_ties']} near-ties, {s['other_differences']} other, "
                     f"max move {s['max_abs_diff']:.3g}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, a short context (CI)")
    parser.add_argument("--device", default=None, help="cuda (default where there is one) or cpu")
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated names of fixtures/gpu-configs/*.json")
    parser.add_argument("--context", type=int, default=None, help="cached tokens per sequence (1000; 48 dry)")
    parser.add_argument("--iters", type=int, default=None, help="timed steps per figure (20; 2 dry)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (5; 1 dry)")
    parser.add_argument("--exact-model", default="smollm2-135m",
                        help="the exactness checks' model shape ('' skips them)")
    parser.add_argument("--exact-steps", type=int, default=6)
    parser.add_argument("--engine-model", default="smollm2-135m",
                        help="the engine figures' model shape ('' skips them)")
    parser.add_argument("--engine-prompt", type=int, default=None, help="prompt tokens (1000; 64 dry)")
    parser.add_argument("--engine-tokens", type=int, default=None, help="new tokens a sequence (64; 8 dry)")
    parser.add_argument("--out", type=Path, default=Path("out") / "gpu-check.json")
    args = parser.parse_args(argv)
    dry = args.dry_run
    device = torch.device(args.device or ("cpu" if dry or not torch.cuda.is_available() else "cuda"))
    args.context = args.context or (48 if dry else 1000)
    args.iters = args.iters or (2 if dry else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if dry else 5)
    args.engine_prompt = args.engine_prompt or (64 if dry else 1000)
    args.engine_tokens = args.engine_tokens or (8 if dry else 64)
    if dry:
        args.exact_steps = min(args.exact_steps, 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "device": str(device),
                              "dry_run": dry, "versions": versions(device), "bandwidth": bandwidth(device),
                              "models": {}}

    def save() -> None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    def log(line: str) -> None:
        print(line, flush=True)

    save()
    for name in [m for m in args.models.split(",") if m]:
        try:
            bw = result["bandwidth"]["bytes_per_s"]
            result["models"][name] = measure_model(name, args, device, bw, log)
        except Exception as exc:  # the next model still runs
            result["models"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            log(f"{name}: {result['models'][name]['error']}")
        save()
    if args.engine_model:
        try:
            result["engine"] = engine_figures(args.engine_model, args, device, log)
        except Exception as exc:  # reported in the JSON; the exactness checks still run
            result["engine"] = {"error": f"{type(exc).__name__}: {exc}"}
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        save()
    if args.exact_model:
        result["exactness"] = {}
        for dtype in (torch.float32, torch.bfloat16):
            key = str(dtype).removeprefix("torch.")
            try:
                result["exactness"][key] = exactness(args.exact_model, dtype, args, device)
            except Exception as exc:  # reported in the JSON; the other dtype still runs
                result["exactness"][key] = {"error": f"{type(exc).__name__}: {exc}"}
            save()
    print("\n".join(summary(result)))
    print(f"wrote {args.out}")
    failed = [n for n, m in result["models"].items() if "error" in m]
    failed += [k for k, e in result.get("exactness", {}).items() if "error" in e]
    failed += ["engine"] if "error" in result.get("engine", {}) else []
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
