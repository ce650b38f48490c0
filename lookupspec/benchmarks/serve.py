"""Closed-loop serving benchmark of an OpenAI-compatible endpoint at a sweep of concurrency levels.

By default it starts `lookupspec serve` itself (a fresh temporary --data-dir; its output goes to a log
file named in the output) and stops it with SIGTERM at the end; --url measures a running server
instead: lookupspec, or any other OpenAI-compatible one (`transformers serve`, llama.cpp's
`llama-server`), on the same prompt files.

At concurrency N, N client tasks share one iterator over the level's requests (--requests, default
every prompt once and at least N): each sends the next one as soon as its previous response ended
(streaming chat, greedy, stream_options.include_usage). Per level it reports aggregate output tokens/s
(completion tokens / the pass's wall time), requests/s, TTFT and inter-token latency p50/p99,
acceptance length and, from /metrics deltas over the pass, the server's decode throughput. Against
lookupspec every level runs twice, speculation on (lookup sources --sources) and off
(lookup.enabled=false), as two back-to-back passes whose order alternates from level to level (on, off;
then off, on; ...), so drift in the machine's load hits both modes alike. Warm-up requests run first
and are not counted, nor is one one-token request per distinct response_format of the prompt set
(a server compiles a schema's grammar on first use, seconds, and then keeps it). A server started here
gets one API key per pass (and per mode's warm-up), so each pass runs in a namespace of its own and
finds nothing an earlier pass left in the prefix cache or the output index (--shared-namespace: one
namespace for all, as before); hits within a pass still count.

Rules (the JSON's `rules` repeats them):
- TTFT: request sent to the first SSE event with text, queueing included.
- ITL: per-token gaps between consecutive arrivals of text (an arrival: the SSE events of one network
  read); an arrival carrying k tokens contributes k gaps of gap/k (the rule of the server's
  lookupspec_inter_token_latency_seconds). An event's tokens are what its text encodes to with the
  model's tokenizer (--tokenizer; by default the served model's, when it is a local model); without
  a tokenizer every event counts as one token, which is exact for servers that stream one token per
  event. They are measured while the other streams' prompts are being prefilled, as they arrive.
  Per-event gaps are in the JSON too.
- Acceptance length: summed (accepted + steps) over summed steps of the pass's responses, from the
  `speculation` object lookupspec adds to the final chunk (token-weighted, not a mean of means).
- Decode throughput: delta of lookupspec_decode_tokens_total / delta of
  lookupspec_decode_seconds_total over the pass (tokens emitted by decode steps per second spent in
  them; prefill excluded), scraped when the server is idle before and after the pass; the mean batch
  is delta step_sequences / delta steps.
- Exactness: every response's text is recorded and compared with the same prompt's response at the
  lowest level (1 by default) in the same mode, and, at each level, speculation on with off.
- Validity: a prompt with a ``response_format`` (``--prompts extraction``) sends it with its request;
  every response's text is parsed and validated against the schema (``valid`` per response and per
  pass; a response cut by max_tokens is not valid).

Example: lookupspec bench-serve --concurrency 1,8 --json out/serve.json --plot out/serve.png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lookupspec.benchmarks.http_client import bearer
from lookupspec.benchmarks.prompts import (
    DEFAULT_PROMPTS,
    EXTRACTION_PROMPTS,
    BenchPrompt,
    load_prompts,
    select_prompts,
)
from lookupspec.benchmarks.serve_load import LoadSettings, Target, pass_labels, sweep
from lookupspec.benchmarks.serve_report import RULES, count_differences, markdown_tables, plot_sweep
from lookupspec.benchmarks.validity import output_checker
from lookupspec.commands.common import non_negative_int, positive_int

__all__ = ["PROMPT_SETS", "configure", "pass_keys", "run"]

PROMPT_SETS = {"default": DEFAULT_PROMPTS, "short": DEFAULT_PROMPTS.with_name("short_prompts.jsonl"),
               "extraction": EXTRACTION_PROMPTS}
MODES = ("on", "off")
_SERVE_FLAGS = ("--dtype", "--device", "--max-batch", "--max-batch-tokens", "--prefill-chunk",
                "--kv-cache-mb", "--threads", "--serve-arg", "--server-log")


def _levels(text: str) -> list[int]:
    levels = list(dict.fromkeys(positive_int(x) for x in text.split(",") if x.strip()))
    if not levels:
        raise argparse.ArgumentTypeError("needs at least one level")
    return levels


def _modes(text: str) -> list[str]:
    modes = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not modes or any(m not in MODES for m in modes):
        raise argparse.ArgumentTypeError(f"a comma-separated subset of {','.join(MODES)}")
    return modes


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--url", default=None, help="base URL of a running server (http://HOST:PORT); unset: start "
      "`lookupspec serve` with the flags below")
    a("--server-kind", choices=("auto", "lookupspec", "other"), default="auto",
      help="lookupspec gets the speculation on/off passes and /metrics; auto: lookupspec when /metrics "
           "has lookupspec_ counters")
    a("--api-key", default=None, help="bearer key for --url")
    a("--model", default=os.environ.get("LOOKUPSPEC_MODEL"),
      help="the model to serve (default smollm2-135m-instruct); with --url, the `model` of each request "
           "(default: the first id of /v1/models) [env LOOKUPSPEC_MODEL]")
    a("--dtype", default=None, help="served: --dtype")
    a("--device", default=None, help="served: --device")
    a("--max-batch", type=positive_int, default=None,
      help="served: --max-batch (default: the largest concurrency level)")
    a("--max-batch-tokens", type=positive_int, default=None, help="served: --max-batch-tokens")
    a("--prefill-chunk", type=positive_int, default=None, help="served: --prefill-chunk")
    a("--kv-cache-mb", type=positive_int, default=None, help="served: --kv-cache-mb")
    a("--threads", type=positive_int, default=None, help="served: torch threads (OMP_NUM_THREADS)")
    a("--serve-arg", action="append", default=[], metavar="ARG",
      help="one more argument for `lookupspec serve`, verbatim (repeatable; --serve-arg=--no-lean-forward)")
    a("--server-log", type=Path, default=None,
      help="the served process's output (default: next to --json, else a kept temporary file)")
    a("--prompts", default="default",
      help="JSONL prompt file, or `default` (48 prompts of 700-1200 tokens), `short` (under 100 tokens) or "
           "`extraction` (24 documents, a JSON schema each: give it --max-tokens 320)")
    a("--kinds", default=None, help="comma-separated prompt kinds (None: all)")
    a("--limit", type=positive_int, default=None, help="use the first N prompts, round-robin across kinds")
    a("--concurrency", type=_levels, default="1,4,8,16,32", help="comma-separated levels")
    a("--requests", type=positive_int, default=None,
      help="requests per level, prompts cycled (default: every prompt once, at least one per stream)")
    a("--max-tokens", type=positive_int, default=128, help="max_tokens of every request")
    a("--modes", type=_modes, default=",".join(MODES), help="lookupspec: speculation on, off, or both")
    a("--sources", default="context",
      help="lookup sources when speculation is on; `all`: the server's default, which includes the "
           "namespace's output index, where a prompt's earlier answer makes its drafts perfect (across "
           "levels only with --shared-namespace)")
    a("--shared-namespace", action="store_true",
      help="a server started here: run every pass in one namespace. By default each pass (and each "
           "mode's warm-up) has its own API key and so its own namespace, so no pass finds the prompts "
           "an earlier pass left in the prefix cache (or, with --sources all, their answers in the "
           "output index); shared, later passes get those hits. With --url every request carries "
           "--api-key, and the server's caches are the server's")
    a("--warmup", type=non_negative_int, default=None,
      help="uncounted requests per mode before the sweep (sent at once, with --max-tokens); default: "
           "the largest --concurrency level, so that the server has grown what it keeps per sequence "
           "(lookupspec's KV pool) for that many before any pass is measured")
    a("--extra-body", type=_json_object, default={},
      help='JSON merged into every request, e.g. \'{"cache_prompt": false}\' for llama-server')
    a("--tokenizer", default=None, help="tokenizer that counts each event's tokens for the ITL rule "
      "(model dir, .gguf or named model; default: --model when it is local)")
    a("--timeout", type=float, default=900.0, help="seconds one request may take")
    a("--json", type=Path, default=None, help="write every request's timings and texts and the summary")
    a("--plot", type=Path, default=None, help="PNG of throughput and TTFT against concurrency (matplotlib)")


# ----------------------------------------------------------------------------------------------- run


def _detect_lookupspec(url: str, headers: dict[str, str]) -> bool:
    import httpx

    try:
        r = httpx.get(url + "/metrics", headers=headers, timeout=10)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and re.search(r"^lookupspec_", r.text, re.M) is not None


def _token_counter(args: argparse.Namespace, served: bool) -> Callable[[str], int] | None:
    from lookupspec.models import ModelLoadError, load_tokenizer

    spec = args.tokenizer or args.model
    if spec is None:
        return None
    try:
        tok = load_tokenizer(spec, auto_pull=served)
    except ModelLoadError:
        if args.tokenizer:
            raise
        return None
    return lambda text: len(tok.encode(text, add_special_tokens=False))


def _sweep_modes(args: argparse.Namespace, lookupspec: bool) -> tuple[str, ...]:
    """The modes every level runs: --modes against lookupspec, the server's own settings otherwise."""
    return tuple(args.modes) if lookupspec else ("server",)


def pass_keys(args: argparse.Namespace) -> dict[str, str]:
    """A server started here: pass label -> its API key (the namespace is the label), unless
    --shared-namespace. The server is lookupspec unless --server-kind other says to treat it as
    another (auto finds the lookupspec it started). Example: --concurrency 1 --modes on ->
    {"warmup-on": "bench-warmup-on", "1-on": "bench-1-on"}."""
    if args.shared_namespace:
        return {}
    modes = _sweep_modes(args, args.server_kind != "other")
    return {label: f"bench-{label}" for label in pass_labels(LoadSettings(tuple(args.concurrency), modes))}


def _serve_args(args: argparse.Namespace, keys: dict[str, str]) -> list[str]:
    out = ["--max-batch", str(args.max_batch or max(args.concurrency)),
           "--max-queue", str(max(64, 2 * max(args.concurrency))), "--log-level", "warning"]
    for label, key in keys.items():
        out += ["--api-key", f"{key}:{label}"]
    for flag, value in (("--dtype", args.dtype), ("--device", args.device),
                        ("--max-batch-tokens", args.max_batch_tokens),
                        ("--prefill-chunk", args.prefill_chunk), ("--kv-cache-mb", args.kv_cache_mb)):
        if value is not None:
            out += [flag, str(value)]
    return out + list(args.serve_arg)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _kept_log() -> Path:
    fd, name = tempfile.mkstemp(prefix="bench-serve-", suffix=".log")
    os.close(fd)
    return Path(name)


def run(args: argparse.Namespace) -> int:
    from lookupspec.benchmarks.report import missing_matplotlib
    from lookupspec.benchmarks.server_process import ServeProcess
    from lookupspec.models import DEFAULT_MODEL, ModelLoadError

    problem = missing_matplotlib(args.plot)
    try:
        prompts = select_prompts(load_prompts(PROMPT_SETS.get(args.prompts, args.prompts)),
                                 args.kinds.split(",") if args.kinds else None, args.limit)
        for p in prompts:  # a schema that is not one fails here, not in every response
            try:
                output_checker(p.response_format)
            except ValueError as exc:
                raise ValueError(f"{p.id}: response_format: {exc}") from None
    except (OSError, ValueError, ImportError) as exc:
        problem = problem or f"prompts: {exc}"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    served = args.url is None
    if served:
        args.model = args.model or DEFAULT_MODEL
    else:
        ignored = [f for f in _SERVE_FLAGS if getattr(args, f[2:].replace("-", "_")) not in (None, [])]
        if ignored:
            _log(f"warning: {', '.join(ignored)} apply only to a server bench-serve starts itself (no --url)")
    try:
        count_tokens = _token_counter(args, served)
    except ModelLoadError as exc:
        print(f"error: --tokenizer: {exc}", file=sys.stderr)
        return 2
    keys = pass_keys(args) if served else {}
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        server = None
        if served:
            log_path = args.server_log or (args.json.with_suffix(".server.log") if args.json else _kept_log())
            server = ServeProcess(args.model, Path(tmp) / "data", log_path,
                                  serve_args=_serve_args(args, keys), threads=args.threads,
                                  api_key=next(iter(keys.values()), None))
        try:  # from here on, whatever happens (a closed stderr included), the server is stopped
            if server is not None:
                _log(f"starting lookupspec serve on {server.url} (log: {server.log_path}) ...")
                server.wait_ready()
            target, settings = _target(args, server, keys)
            if target.lookupspec and count_tokens is None:
                _log("warning: no tokenizer (--tokenizer): each SSE event counts as one token, so ITL is "
                     "lookupspec's per-step latency")
            _log(f"measuring {target.model} at {target.url} "
                 f"({'lookupspec' if target.lookupspec else 'other server'}), {len(prompts)} prompts")
            passes = asyncio.run(sweep(target, settings, prompts, count_tokens))
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        finally:
            status = server.stop() if server is not None else None
    result = _result(args, target, settings, prompts, passes, server, status, count_tokens is not None)
    return _report(args, result)


def _target(args: argparse.Namespace, server: Any, keys: dict[str, str]) -> tuple[Target, LoadSettings]:
    url = server.url if server is not None else args.url.rstrip("/")
    headers = bearer(args.api_key)
    lookupspec = (args.server_kind == "lookupspec" or
                  (args.server_kind == "auto" and _detect_lookupspec(url, headers)))
    model = server.model_id() if server is not None else (args.model or _first_model(url, headers))
    sources = [x.strip() for x in args.sources.split(",") if x.strip()]
    settings = LoadSettings(levels=tuple(args.concurrency), modes=_sweep_modes(args, lookupspec),
                            max_tokens=args.max_tokens, requests=args.requests,
                            sources=None if sources == ["all"] else tuple(sources),
                            warmup=args.warmup, extra_body=args.extra_body, timeout_s=args.timeout)
    return Target(url, model, lookupspec, headers, pass_keys=keys), settings


def _first_model(url: str, headers: dict[str, str]) -> str:
    import httpx

    try:
        return httpx.get(url + "/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        raise RuntimeError(f"cannot read the model id from {url}/v1/models ({exc}); pass --model") from exc


def _result(args: argparse.Namespace, target: Target, settings: LoadSettings, prompts: Sequence[BenchPrompt],
            passes: list[dict[str, Any]], server: Any, status: int | None, tokenizer: bool) -> dict[str, Any]:
    from lookupspec.benchmarks.report import machine_info

    reference = min(args.concurrency)  # 1 by default
    count_differences(passes, reference)
    return {
        "command": "bench-serve", "machine": machine_info(),
        "server": {"url": target.url, "kind": "lookupspec" if target.lookupspec else "other",
                   "model": target.model, "started_here": server is not None,
                   "command": server.command if server is not None else None,
                   "threads": args.threads, "log": str(server.log_path) if server is not None else None,
                   "exit_status": status},
        "prompts": {"file": str(PROMPT_SETS.get(args.prompts, args.prompts)), "count": len(prompts),
                    "kinds": sorted({p.kind for p in prompts})},
        "settings": {"levels": args.concurrency, "modes": list(settings.modes), "max_tokens": args.max_tokens,
                     "requests": args.requests, "sources": args.sources, "warmup": settings.warmup_requests,
                     "extra_body": args.extra_body, "tokenizer_counts_events": tokenizer,
                     "namespaces": "per-pass" if target.pass_keys else "shared",
                     "reference_level": reference},
        "rules": RULES,
        "summary": [p["summary"] for p in passes],
        "passes": passes,
    }


def _report(args: argparse.Namespace, result: dict[str, Any]) -> int:
    print(markdown_tables(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False))
        _log(f"wrote {args.json}")
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        plot_sweep(result, args.plot)
        _log(f"wrote {args.plot}")
    if result["server"]["log"]:
        _log(f"server log: {result['server']['log']}")
    errors = sum(s["errors"] for s in result["summary"])
    invalid = sum(s["checked"] - s["valid"] for s in result["summary"])
    if invalid:
        _log(f"warning: {invalid} responses do not follow their prompt's response_format "
             "(see `invalid` in the JSON)")
    differ = sum((s["exactness"] or {}).get("differ", 0) for s in result["summary"])
    if differ:
        _log(f"warning: {differ} responses differ from the same prompt's at the reference level")
    if errors:
        _log(f"warning: {errors} requests failed (see `error` in the JSON)")
    return 1 if errors else 0
