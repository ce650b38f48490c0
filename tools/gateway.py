"""HTTP gateway benchmark: streaming through `lookupspec serve` against the same engine in process.

Two measurements, on one model (SmolLM2-135M-Instruct by default):

1. **Throughput ratio.** Each prompt is generated in process (``Engine.generate``) and as an SSE
   stream from a real server process, alternating prompt by prompt (so drift in machine load hits
   both sides alike). tokens/s = completion tokens / wall time from sending the request to its last
   token. Both sides run the same speculation settings (``--spec``; by default the context drafter
   only, so the server's shared output cache cannot give it an advantage) and greedy decoding, so
   they generate the same tokens. Target: HTTP / in-process >= 0.95.
2. **Latency under concurrency.** 1, 4 and 16 concurrent streaming clients; TTFT (request sent to the
   first chunk with text) and inter-token latency (gap between consecutive text chunks; a step that
   emits several tokens arrives as one chunk) at p50 / p99. One generation runs at a time, so TTFT
   grows with the queue: that is the queueing the single worker implies, not HTTP overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lookupspec.benchmarks.http_client import percentile, stream_chat
from lookupspec.benchmarks.server_process import ServeProcess
from lookupspec.commands.common import add_model_arguments

__all__ = ["configure", "run"]

PROMPTS = [
    "Summarize in three sentences: The shared store keeps documents, collections and output caches as "
    "an append-only log per namespace, and every replica rebuilds its lookup indexes from that log.",
    "Answer from the context. Context: lookupspec verifies every draft with the target model in one "
    "forward pass, so its output equals plain decoding. Question: does speculation change the output?",
    "Rewrite this Python function with type hints: def add(a, b):\n    return a + b",
    "Write a short paragraph about a lighthouse keeper who finds a message in a bottle.",
]


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per throughput request")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the prompts for throughput")
    parser.add_argument("--latency-max-tokens", type=int, default=64, help="tokens per latency request")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrent streams")
    parser.add_argument("--requests", type=int, default=16,
                        help="latency requests per concurrency level (at least one per stream)")
    parser.add_argument("--spec", choices=("context", "off", "all"), default="context",
                        help="speculation on both sides: context drafter only, none, or every source")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads on both sides (0: torch's default). On a shared machine 1 avoids "
                             "the stalls a busy core causes in multi-threaded kernels")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")


def _lookup(spec: str) -> dict[str, Any]:
    if spec == "off":
        return {"enabled": False}
    if spec == "context":
        return {"sources": ["context"]}
    return {}


def _spec_params(spec: str) -> Any:
    from lookupspec.params import SpecParams

    if spec == "off":
        return SpecParams(enabled=False)
    if spec == "context":
        return SpecParams(sources=("context",))
    return None


async def _stream(http: Any, model: str, prompt: str, max_tokens: int,
                  lookup: dict[str, Any]) -> dict[str, Any]:
    """One streamed chat request: its timings and token count."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream_options": {"include_usage": True}, "lookup": lookup}
    r = await stream_chat(http, body)
    if r.error is not None:
        raise RuntimeError(r.error)
    last = r.times[-1] if r.times else r.sent
    return {"ttft": last - r.sent if r.ttft is None else r.ttft, "gaps": r.chunk_gaps,
            "seconds": last - r.sent, "tokens": r.completion_tokens or 0}


def _in_process(te: Any, prompt: str, max_tokens: int, spec: Any) -> dict[str, Any]:
    ids = te.encode_prompt(messages=[{"role": "user", "content": prompt}])
    params = te.params(max_tokens=max_tokens, temperature=0.0)
    t0 = time.perf_counter()
    tokens = 0
    for step in te.engine.generate(ids, params, spec=spec):
        tokens += len(step.tokens)
    return {"seconds": time.perf_counter() - t0, "tokens": tokens}


async def _throughput(te: Any, server: ServeProcess, model: str, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    lookup, spec = _lookup(args.spec), _spec_params(args.spec)
    rows = []
    async with httpx.AsyncClient(base_url=server.url, timeout=600) as http:
        await _stream(http, model, "warm up", 8, lookup)  # first-request costs on both sides
        _in_process(te, "warm up", 8, spec)
        for rnd in range(args.rounds):
            for i, prompt in enumerate(PROMPTS):
                # alternate which side goes first, so neither always runs on a warmer machine
                order = ("http", "local") if (rnd + i) % 2 == 0 else ("local", "http")
                row: dict[str, Any] = {"prompt": i, "round": rnd}
                for side in order:
                    if side == "http":
                        row["http"] = await _stream(http, model, prompt, args.max_tokens, lookup)
                        del row["http"]["gaps"]
                    else:
                        row["local"] = _in_process(te, prompt, args.max_tokens, spec)
                rows.append(row)
    local_tps = sum(r["local"]["tokens"] for r in rows) / sum(r["local"]["seconds"] for r in rows)
    http_tps = sum(r["http"]["tokens"] for r in rows) / sum(r["http"]["seconds"] for r in rows)
    same_tokens = all(r["local"]["tokens"] == r["http"]["tokens"] for r in rows)
    # Per prompt pair, then the median: robust to a load spike on a shared machine hitting one run.
    tps = [(r["http"]["tokens"] / r["http"]["seconds"], r["local"]["tokens"] / r["local"]["seconds"])
           for r in rows if r["local"]["tokens"] and r["http"]["tokens"]]
    pair_ratios = [h / local for h, local in tps]
    return {"in_process_tokens_per_s": local_tps, "http_tokens_per_s": http_tps,
            "ratio": http_tps / local_tps, "median_pair_ratio": statistics.median(pair_ratios),
            "same_token_counts": same_tokens, "rows": rows}


async def _latency(server: ServeProcess, model: str, args: argparse.Namespace,
                   streams: int) -> dict[str, Any]:
    import httpx

    lookup = _lookup(args.spec)
    per_stream = max(1, args.requests // streams)
    results: list[dict[str, Any]] = []

    async def client(s: int, http: httpx.AsyncClient) -> None:
        for r in range(per_stream):
            prompt = PROMPTS[(s + r) % len(PROMPTS)] + f" (stream {s}, request {r})"
            results.append(await _stream(http, model, prompt, args.latency_max_tokens, lookup))

    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(base_url=server.url, timeout=900, limits=limits) as http:
        await asyncio.gather(*(client(s, http) for s in range(streams)))
    wall = time.perf_counter() - t0
    ttft = [r["ttft"] for r in results]
    gaps = [g for r in results for g in r["gaps"]]
    return {"streams": streams, "requests": len(results),
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "itl_p50_s": percentile(gaps, 50), "itl_p99_s": percentile(gaps, 99),
            "aggregate_tokens_per_s": sum(r["tokens"] for r in results) / wall}


def _table(result: dict[str, Any]) -> str:
    t = result["throughput"]
    ms = lambda v: "-" if v is None else f"{1000 * v:.1f}"  # noqa: E731
    lines = [
        f"model {result['model']}, speculation: {result['spec']}, {result['max_tokens']} tokens per request, "
        f"torch threads: {result['threads'] or 'default'}",
        "",
        "| single stream | tokens/s |",
        "|---|---|",
        f"| in process | {t['in_process_tokens_per_s']:.1f} |",
        f"| HTTP streaming | {t['http_tokens_per_s']:.1f} |",
        f"| ratio of totals (target >= 0.95) | {t['ratio']:.3f} |",
        f"| median per-prompt ratio | {t['median_pair_ratio']:.3f} |",
        "",
        "| streams | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | aggregate tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["latency"]:
        lines.append(f"| {row['streams']} | {ms(row['ttft_p50_s'])} | {ms(row['ttft_p99_s'])} | "
                     f"{ms(row['itl_p50_s'])} | {ms(row['itl_p99_s'])} | "
                     f"{row['aggregate_tokens_per_s']:.1f} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from lookupspec.models import ModelLoadError
    from lookupspec.text import TextEngine

    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        te = TextEngine.load(args.model, dtype=args.dtype, device=args.device, auto_pull=True,
                             packed_linear=args.packed_linear, lean_forward=args.lean_forward,
                             log=lambda m: print(m, file=sys.stderr))
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        workdir = Path(tmp)
        server = ServeProcess(args.model, workdir / "data", workdir / "server.log", threads=args.threads,
                              serve_args=["--dtype", args.dtype, "--device", args.device,
                                          "--max-queue", "256", "--log-level", "warning"])
        try:
            server.wait_ready()
            model = server.model_id()
            print(f"server ready ({model}); measuring throughput ...", file=sys.stderr)
            throughput = asyncio.run(_throughput(te, server, model, args))
            del te  # free the in-process model before the latency runs
            latency = []
            for streams in levels:
                print(f"latency at {streams} concurrent stream(s) ...", file=sys.stderr)
                latency.append(asyncio.run(_latency(server, model, args, streams)))
        finally:
            server.stop()
    result: dict[str, Any] = {"model": args.model, "spec": args.spec, "max_tokens": args.max_tokens,
                              "threads": args.threads or None,
                              "latency_max_tokens": args.latency_max_tokens, "throughput": throughput,
                              "latency": latency, "cpu_count": os.cpu_count()}
    with contextlib.suppress(Exception):
        from lookupspec.benchmarks.report import machine_info

        result["machine"] = machine_info()
    print(_table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}", file=sys.stderr)
    if not throughput["same_token_counts"]:
        print("warning: HTTP and in-process generated different token counts", file=sys.stderr)
    return 0
