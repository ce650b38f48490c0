"""Prefix-cache benchmark: TTFT and tokens/s of the same requests with the prefix cache on and off.

It starts two `lookupspec serve` processes on the same model and flags, one with its prefix cache
(--prefix-cache-mb) and one with --no-prefix-cache, and sends every prompt to both, one request at a
time (concurrency 1, so TTFT is prefill and nothing else), alternating which server goes first from
one prompt of a set to the next so drift in the machine's load hits both alike. Two prompt sets run
interleaved (shared, unshared, shared, ...):

- shared (--shared, default `rag`: fixtures/bench/rag_shared.jsonl): questions over the same retrieved
  passages behind one system prompt, ~91% of each prompt the same tokens. The first one fills the
  cache; the others should find their first whole prefill chunks in it.
- unshared (--unshared, default `default`: the 48 default prompts, --unshared-limit of them): prompts
  that share nothing beyond a system line, the case where the cache may cost but must not help.

Rules (the JSON's `rules` repeats them):
- Order: each prompt goes to both servers back to back; which goes first alternates from one prompt
  of a set to the next, so within each set half the pairs start with either server.
- TTFT: request sent to the first SSE event with text. Tokens/s: completion tokens / request wall
  time, summed over a set's requests per server (prefill included, as a caller sees it).
- Cached share: usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens, as the server reports.
- A shared request counts as warm when the cache-on server reused >= --warm-share of its prompt; the
  TTFT ratio compares the warm requests' median TTFT with the same prompts' median on the other server.
- Exactness: every response's text with the cache on equals the same prompt's text with it off.

Example: python -m tools bench-prefix --json out/prefix.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lookupspec.benchmarks.prompts import DEFAULT_PROMPTS, BenchPrompt, load_prompts, select_prompts
from lookupspec.benchmarks.serve import PROMPT_SETS as SERVE_PROMPT_SETS
from lookupspec.commands.common import non_negative_int, positive_int

__all__ = ["PROMPT_SETS", "configure", "interleave", "run", "summarize_set"]

PROMPT_SETS = {**SERVE_PROMPT_SETS, "rag": DEFAULT_PROMPTS.with_name("rag_shared.jsonl")}
SERVERS = ("on", "off")
RULES = {
    "ttft": "request sent to the first SSE event with text; one request at a time",
    "tokens_per_s": "completion tokens / request wall time, summed over a set's requests per server",
    "cached_share": "usage.prompt_tokens_details.cached_tokens / usage.prompt_tokens",
    "warm": "a shared request whose cache-on response reused >= warm_share of its prompt",
    "order": "each prompt goes to both servers back to back; which goes first alternates within a set",
    "exactness": "text with the cache on == text with it off, per prompt",
}


def _unit(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--model", default=os.environ.get("LOOKUPSPEC_MODEL"),
      help="the model both servers serve (default smollm2-135m-instruct) [env LOOKUPSPEC_MODEL]")
    a("--shared", default="rag", help="prompts that share a long prefix: a JSONL file or `rag`")
    a("--unshared", default="default",
      help="prompts that share nothing: a JSONL file, `default` (48 prompts of 700-1200 tokens) or `short`")
    a("--unshared-limit", type=non_negative_int, default=12,
      help="use the first N unshared prompts, round-robin across kinds (0: none)")
    a("--max-tokens", type=positive_int, default=128, help="max_tokens of every request")
    a("--prefix-cache-mb", type=positive_int, default=None,
      help="the cache-on server's --prefix-cache-mb (default: serve's own)")
    a("--warm-share", type=_unit, default=0.9,
      help="the cached share of its prompt from which a shared request counts as warm")
    a("--sources", default="context", help="lookup sources of every request (speculation on, both servers)")
    a("--threads", type=positive_int, default=None, help="torch threads of each server (OMP_NUM_THREADS)")
    a("--serve-arg", action="append", default=[], metavar="ARG",
      help="one more argument for both `lookupspec serve` processes, verbatim (repeatable)")
    a("--timeout", type=float, default=900.0, help="seconds one request may take")
    a("--json", type=Path, default=None,
      help="write every request's timings, usage and text, and the summary")


# ------------------------------------------------------------------------------------------ the pure part


def interleave(*sets: Sequence[BenchPrompt]) -> list[tuple[int, BenchPrompt]]:
    """(set index, prompt) taking one prompt of each set in turn. Example: (a1, a2, a3), (b1,) ->
    a1 b1 a2 a3."""
    out: list[tuple[int, BenchPrompt]] = []
    for i in range(max((len(s) for s in sets), default=0)):
        out.extend((k, s[i]) for k, s in enumerate(sets) if i < len(s))
    return out


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize_set(records: Sequence[Mapping[str, Any]], warm_share: float | None) -> dict[str, Any]:
    """One prompt set's summary from its records (``server``, ``prompt``, ``ttft_s``, ``wall_s``,
    ``completion_tokens``, ``prompt_tokens``, ``cached_tokens``, ``text``, ``error``). With
    ``warm_share``, TTFT is also compared on the warm requests only (see the module's rules)."""
    ok = [r for r in records if not r["error"]]
    by: dict[str, dict[str, Mapping[str, Any]]] = {s: {} for s in SERVERS}
    for r in ok:
        by[r["server"]][r["prompt"]] = r
    both = [p for p in by["on"] if p in by["off"]]
    out: dict[str, Any] = {"requests": len(records), "errors": len(records) - len(ok), "prompts": len(both)}
    for s in SERVERS:
        rs = [by[s][p] for p in both]
        tokens = sum(r["completion_tokens"] or 0 for r in rs)
        wall = sum(r["wall_s"] for r in rs)
        prompt_tokens = sum(r["prompt_tokens"] or 0 for r in rs)
        out[s] = {"ttft_p50_s": _median([r["ttft_s"] for r in rs if r["ttft_s"] is not None]),
                  "tokens_per_s": tokens / wall if wall else None,
                  "cached_share": (sum(r["cached_tokens"] or 0 for r in rs) / prompt_tokens
                                   if prompt_tokens else None)}
    out["ttft_ratio"] = _ratio(out["on"]["ttft_p50_s"], out["off"]["ttft_p50_s"])
    out["tokens_per_s_ratio"] = _ratio(out["on"]["tokens_per_s"], out["off"]["tokens_per_s"])
    out["differ"] = sorted(p for p in both if by["on"][p]["text"] != by["off"][p]["text"])
    if warm_share is not None:
        warm = [p for p in both if by["on"][p]["prompt_tokens"]
                and (by["on"][p]["cached_tokens"] or 0) >= warm_share * by["on"][p]["prompt_tokens"]]
        on = _median([by["on"][p]["ttft_s"] for p in warm if by["on"][p]["ttft_s"] is not None])
        off = _median([by["off"][p]["ttft_s"] for p in warm if by["off"][p]["ttft_s"] is not None])
        out["warm"] = {"prompts": len(warm), "on_ttft_p50_s": on, "off_ttft_p50_s": off,
                       "ttft_ratio": _ratio(on, off)}
    return out


def markdown(result: Mapping[str, Any]) -> str:
    def f(v: float | None, spec: str, scale: float = 1.0) -> str:
        return "-" if v is None else format(v * scale, spec)

    lines = ["| prompts | n | TTFT p50 on / off (ms) | TTFT on/off | tok/s on / off | tok/s on/off "
             "| cached share on | differ |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in result["summary"].items():
        lines.append(
            f"| {name} | {s['prompts']} | {f(s['on']['ttft_p50_s'], '.0f', 1e3)} / "
            f"{f(s['off']['ttft_p50_s'], '.0f', 1e3)} | {f(s['ttft_ratio'], '.3f')} | "
            f"{f(s['on']['tokens_per_s'], '.1f')} / {f(s['off']['tokens_per_s'], '.1f')} | "
            f"{f(s['tokens_per_s_ratio'], '.3f')} | {f(s['on']['cached_share'], '.1%')} | "
            f"{len(s['differ'])} |")
        if "warm" in s:
            w = s["warm"]
            share = result["settings"]["warm_share"]
            lines.append(f"| {name}, warm (>= {share:.0%} cached) | {w['prompts']} | "
                         f"{f(w['on_ttft_p50_s'], '.0f', 1e3)} / {f(w['off_ttft_p50_s'], '.0f', 1e3)} | "
                         f"{f(w['ttft_ratio'], '.3f')} | | | | |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- the run


async def _one(http: Any, model: str, prompt: BenchPrompt, args: argparse.Namespace) -> dict[str, Any]:
    from lookupspec.benchmarks.http_client import stream_chat

    body = {"model": model, "messages": [dict(m) for m in prompt.messages], "max_tokens": args.max_tokens,
            "temperature": 0, "stream_options": {"include_usage": True},
            "lookup": {"enabled": True, "sources": [x.strip() for x in args.sources.split(",") if x.strip()]}}
    try:
        r = await stream_chat(http, body)
    except Exception as exc:  # a transport error is this request's result, not the run's
        return {"ttft_s": None, "wall_s": 0.0, "completion_tokens": None, "prompt_tokens": None,
                "cached_tokens": None, "text": "", "error": f"{type(exc).__name__}: {exc}"}
    usage = r.usage or {}
    return {"ttft_s": r.ttft, "wall_s": (r.finished or r.sent) - r.sent,
            "completion_tokens": usage.get("completion_tokens"), "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "text": r.text, "error": r.error}


async def _drive(urls: Mapping[str, str], model: str, order: Sequence[tuple[int, BenchPrompt]],
                 names: Sequence[str], warmup: Sequence[BenchPrompt],
                 args: argparse.Namespace) -> list[dict[str, Any]]:
    import httpx

    timeout = httpx.Timeout(args.timeout, connect=30.0)
    clients = {s: httpx.AsyncClient(base_url=urls[s], timeout=timeout) for s in SERVERS}
    try:
        for p in warmup:  # uncounted: first-request costs (kernel compiles, allocator growth)
            for s in SERVERS:
                await _one(clients[s], model, p, args)
        records: list[dict[str, Any]] = []
        seen = [0] * len(names)  # prompts of each set so far: the first server alternates within a set
        for i, (k, prompt) in enumerate(order):
            first = seen[k] % 2
            seen[k] += 1
            for s in (SERVERS if first == 0 else SERVERS[::-1]):
                rec = {"set": names[k], "prompt": prompt.id, "server": s, "position": i,
                       **await _one(clients[s], model, prompt, args)}
                records.append(rec)
                cached = rec["cached_tokens"]
                print(f"[bench-prefix] {i + 1}/{len(order)} {s:>3} {prompt.id}: "
                      + (f"error {rec['error']}" if rec["error"] else
                         f"TTFT {rec['ttft_s'] * 1e3:.0f} ms, {rec['completion_tokens']} tokens in "
                         f"{rec['wall_s']:.2f} s, cached {cached}/{rec['prompt_tokens']}"),
                      file=sys.stderr, flush=True)
        return records
    finally:
        for c in clients.values():
            await c.aclose()


def _load(name: str, limit: int | None) -> list[BenchPrompt]:
    return select_prompts(load_prompts(PROMPT_SETS.get(name, name)), None, limit)


def run(args: argparse.Namespace) -> int:
    from lookupspec.benchmarks.report import machine_info
    from lookupspec.benchmarks.server_process import ServeProcess
    from lookupspec.models import DEFAULT_MODEL

    model = args.model or DEFAULT_MODEL
    try:
        shared = _load(args.shared, None)
        unshared = _load(args.unshared, args.unshared_limit) if args.unshared_limit > 0 else []
        warmup = _load("short", 2)
    except (OSError, ValueError) as exc:
        print(f"error: prompts: {exc}", file=sys.stderr)
        return 2
    if {p.id for p in shared} & {p.id for p in unshared}:
        print("error: --shared and --unshared hold the same prompt ids", file=sys.stderr)
        return 2
    extra = {"on": ["--prefix-cache-mb", str(args.prefix_cache_mb)] if args.prefix_cache_mb else [],
             "off": ["--no-prefix-cache"]}
    with tempfile.TemporaryDirectory(prefix="bench-prefix-") as tmp:
        log_dir = args.json.parent if args.json else Path(tempfile.mkdtemp(prefix="bench-prefix-logs-"))
        stem = args.json.stem if args.json else "prefix"
        servers: dict[str, Any] = {}
        try:
            for s in SERVERS:
                servers[s] = ServeProcess(model, Path(tmp) / s, log_dir / f"{stem}.server-{s}.log",
                                          serve_args=[*args.serve_arg, *extra[s]], threads=args.threads)
            for s in SERVERS:
                print(f"[bench-prefix] starting the cache-{s} server on {servers[s].url} "
                      f"(log: {servers[s].log_path}) ...", file=sys.stderr, flush=True)
                servers[s].wait_ready()
            model_id = servers["on"].model_id()
            records = asyncio.run(_drive({s: servers[s].url for s in SERVERS}, model_id,
                                         interleave(shared, unshared), ("shared", "unshared"), warmup, args))
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        finally:
            statuses = {s: p.stop() for s, p in servers.items()}
    summary = {"shared": summarize_set([r for r in records if r["set"] == "shared"], args.warm_share)}
    if unshared:
        summary["unshared"] = summarize_set([r for r in records if r["set"] == "unshared"], None)
    result = {"command": "bench-prefix", "machine": machine_info(), "model": model_id,
              "servers": {s: {"command": p.command, "log": str(p.log_path), "exit_status": statuses[s]}
                          for s, p in servers.items()},
              "prompts": {"shared": str(PROMPT_SETS.get(args.shared, args.shared)),
                          "shared_count": len(shared),
                          "unshared": str(PROMPT_SETS.get(args.unshared, args.unshared)),
                          "unshared_count": len(unshared)},
              "settings": {"max_tokens": args.max_tokens, "warm_share": args.warm_share,
                           "sources": args.sources, "threads": args.threads, "serve_args": args.serve_arg,
                           "prefix_cache_mb": args.prefix_cache_mb},
              "rules": RULES, "summary": summary, "records": records}
    print(markdown(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False))
        print(f"[bench-prefix] wrote {args.json}", file=sys.stderr)
    differ = sum(len(s["differ"]) for s in summary.values())
    if differ:
        print(f"[bench-prefix] warning: {differ} responses differ between the cache on and off",
              file=sys.stderr)
    return 1 if any(s["errors"] for s in summary.values()) else 0
