"""Lookup-store latency, build speed and memory, against a Hugging Face-style scan and a vLLM-style KMP.

Token streams are synthetic but shaped like retrieval-heavy generation: Zipf-distributed ids over a
49152-token vocabulary (SmolLM2's), with a share of the stream made of spans copied from earlier in
the stream (context) or from the indexed documents (corpus), so lookups hit as they do on RAG
answers. Latency is wall time of one Python-level ``lookup`` call (what the engine pays per step),
measured per call with ``perf_counter_ns``; the context is extended by one token between calls, as in
decoding. ``lookup()`` is the public call (it returns a ``Continuations``); ``lookup_into()`` is what
the composer calls each decode step (it writes into a reused buffer). Both baselines are timed on the
same steps; a baseline gets fewer calls where one call is slow, and is skipped at a size where 20
calls would exceed ``--baseline-budget`` seconds (the output says so).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from typing import Any

__all__ = ["configure", "run"]

VOCAB = 49152
CONTEXT_SIZES = (1_000, 32_000, 256_000, 1_000_000)
CORPUS_SIZES = (1_000_000, 10_000_000)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON to this file")
    parser.add_argument("--lookups", type=int, default=3000, help="timed lookups per size")
    parser.add_argument("--baseline-budget", type=float, default=4.0,
                        help="seconds each baseline may spend per size (fewer calls, or skipped)")
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke test)")
    parser.add_argument("--seed", type=int, default=0)


# -- token streams ---------------------------------------------------------------------------------

def _zipf(rng: Any, n: int) -> Any:
    import numpy as np

    ranks = np.arange(1, VOCAB + 1, dtype=np.float64)
    p = 1.0 / (ranks + 2.7) ** 1.1
    cdf = np.cumsum(p / p.sum())
    return np.minimum(np.searchsorted(cdf, rng.random(n)), VOCAB - 1).astype(np.int32)


def _with_copies(rng: Any, base: Any, source: Any, share: float) -> Any:
    """``base`` with about ``share`` of its tokens overwritten by spans (8-64 tokens) of ``source``
    (``source is None``: earlier parts of the stream itself)."""
    out = base.copy()
    n = out.shape[0]
    copied = 0
    while copied < share * n:
        length = int(rng.integers(8, 65))
        at = int(rng.integers(0, max(1, n - length)))
        if source is None:
            if at < length + 1:
                continue
            src = int(rng.integers(0, at - length))
            out[at:at + length] = out[src:src + length]
        else:
            src = int(rng.integers(0, source.shape[0] - length))
            out[at:at + length] = source[src:src + length]
        copied += length
    return out


# -- timing ----------------------------------------------------------------------------------------

def _pct(samples_ns: list[int]) -> dict[str, float]:
    import numpy as np

    a = np.asarray(samples_ns, dtype=np.float64) / 1000.0
    return {"p50_us": float(np.percentile(a, 50)), "p99_us": float(np.percentile(a, 99)),
            "mean_us": float(a.mean()), "calls": int(a.size)}


def _time_calls(fn: Any, args_list: list[Any]) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for a in args_list:
        t0 = clock()
        fn(a)
        out.append(clock() - t0)
    return out


def _bench_context(rng: Any, size: int, n_lookups: int, budget: float, cfg: Any,
                   chain_cfg: Any) -> dict[str, Any]:
    import numpy as np

    from lookupspec.index import ContextIndex
    from tools.index_baselines import hf_prompt_lookup, vllm_ngram

    stream = _with_copies(rng, _zipf(rng, size + n_lookups), None, 0.3)
    t0 = time.perf_counter()
    store = ContextIndex(stream[:size])
    build_s = time.perf_counter() - t0
    row: dict[str, Any] = {"context_tokens": size, "build_tokens_per_s": size / build_s,
                           "bytes_per_token": store.memory_bytes() / size}
    # Decode emulation: lookups at the current tail, then append the next token (not timed).
    out = np.empty((5, max(cfg.max_nodes, chain_cfg.max_nodes)), np.int64)
    tree, into, chain, hits, match = [], [], [], 0, 0
    clock = time.perf_counter_ns
    gc.disable()
    try:
        for i in range(n_lookups):
            tail = stream[size + i - 64:size + i]
            t1 = clock()
            c = store.lookup(tail, cfg)
            t2 = clock()
            store.lookup_into(tail, cfg, out, 0)
            t3 = clock()
            store.lookup_into(tail, chain_cfg, out, 0)
            t4 = clock()
            tree.append(t2 - t1)
            into.append(t3 - t2)
            chain.append(t4 - t3)
            hits += c.match_len > 1
            match += c.match_len
            store.extend(stream[size + i:size + i + 1])
    finally:
        gc.enable()
    row["ours_lookup"] = _pct(tree)
    row["ours_lookup_into"] = _pct(into)
    row["ours_chain"] = _pct(chain)
    row["hit_rate"] = hits / n_lookups
    row["mean_match_len"] = match / n_lookups
    # Baselines on the same steps (their cost grows with the context: fewer calls at large sizes).
    full = stream
    for name, fn in (("hf_scan", lambda i: hf_prompt_lookup(full[:size + i], 10, 2)),
                     ("vllm_kmp", lambda i: vllm_ngram(full[:size + i], 10, 1, 4))):
        fn(0)
        t0 = time.perf_counter()
        fn(1)
        one = time.perf_counter() - t0
        calls = min(n_lookups, int(budget / max(one, 1e-9)))
        if calls < 20:
            row[name] = {"skipped": f"one call takes {one * 1e3:.1f} ms; over the {budget:g} s budget"}
            continue
        steps = np.linspace(0, n_lookups - 1, calls).astype(int).tolist()
        gc.disable()
        try:
            row[name] = _pct(_time_calls(fn, steps))
        finally:
            gc.enable()
    return row


def _bench_corpus(rng: Any, size: int, n_lookups: int, cfg: Any, chain_cfg: Any) -> dict[str, Any]:
    import numpy as np

    from lookupspec.index import CorpusIndex

    tokens = _with_copies(rng, _zipf(rng, size), None, 0.2)
    doc_len = 1000
    docs = [(f"d{i}", tokens[i * doc_len:(i + 1) * doc_len]) for i in range(size // doc_len)]
    store = CorpusIndex()
    t0 = time.perf_counter()
    store.add_documents(docs)
    build_s = time.perf_counter() - t0
    row: dict[str, Any] = {"corpus_tokens": len(store), "documents": store.num_documents,
                           "build_tokens_per_s": len(store) / build_s,
                           "bytes_per_token": store.memory_bytes() / len(store)}
    # An answer that copies about half of its tokens from the documents.
    answer = _with_copies(rng, _zipf(rng, n_lookups + 64), tokens, 0.5)
    tails = [answer[i:i + 64] for i in range(n_lookups)]
    out = np.empty((5, max(cfg.max_nodes, chain_cfg.max_nodes)), np.int64)
    gc.disable()
    try:
        row["ours_lookup"] = _pct(_time_calls(lambda t: store.lookup(t, cfg), tails))
        row["ours_lookup_into"] = _pct(_time_calls(lambda t: store.lookup_into(t, cfg, out, 0), tails))
        row["ours_chain"] = _pct(_time_calls(lambda t: store.lookup_into(t, chain_cfg, out, 0), tails))
    finally:
        gc.enable()
    matches = [store.lookup(t, cfg).match_len for t in tails[:500]]
    row["hit_rate"] = float(np.mean([m > 1 for m in matches]))
    row["mean_match_len"] = float(np.mean(matches))
    return row


def _bench_incremental(rng: Any, size: int) -> dict[str, Any]:
    from lookupspec.index import CorpusIndex

    tokens = _zipf(rng, size)
    store = CorpusIndex()
    t0 = time.perf_counter()
    for i in range(size // 1000):
        store.add_document(f"d{i}", tokens[i * 1000:(i + 1) * 1000])
    s = time.perf_counter() - t0
    return {"tokens": size, "documents": size // 1000, "tokens_per_s": size / s,
            "segments": len(store.segments), "bytes_per_token": store.memory_bytes() / len(store)}


def _bench_compose(rng: Any, n_steps: int, cfg: Any) -> dict[str, Any]:
    from lookupspec.drafting import Composer, LookupDrafter
    from lookupspec.index import ContextIndex, CorpusIndex, OutputIndex

    corpus_tokens = _zipf(rng, 1_000_000)
    corpus = CorpusIndex()
    corpus.add_documents((f"d{i}", corpus_tokens[i * 1000:(i + 1) * 1000]) for i in range(1000))
    outputs = OutputIndex(cap_tokens=1_000_000)
    out_tokens = _with_copies(rng, _zipf(rng, 200_000), corpus_tokens, 0.3)
    for i in range(0, out_tokens.shape[0], 400):
        outputs.append(out_tokens[i:i + 400])
    stream = _with_copies(rng, _zipf(rng, 32_000 + n_steps), corpus_tokens, 0.4)
    ctx = ContextIndex(stream[:32_000])
    composer = Composer([LookupDrafter((ctx,), cfg, name="context"),
                         LookupDrafter((corpus,), cfg, name="corpus"),
                         LookupDrafter((outputs,), cfg, name="output")])
    samples, nodes = [], 0
    clock = time.perf_counter_ns
    gc.disable()
    try:
        for i in range(n_steps):
            t0 = clock()
            tree = composer.compose(stream[32_000 + i - 64:32_000 + i], 16)
            samples.append(clock() - t0)
            nodes += len(tree)
            if len(tree):
                composer.observe(tree, [0] if tree.tokens[0] == stream[32_000 + i] else [])
            ctx.extend(stream[32_000 + i:32_000 + i + 1])
    finally:
        gc.enable()
    return {"setup": "32k context + 1M-token corpus + 200k-token output index, budget 16",
            **_pct(samples), "mean_nodes": nodes / n_steps}


# -- report ----------------------------------------------------------------------------------------

def _fmt(cell: Any) -> str:
    if not isinstance(cell, dict):
        return "-"
    if "skipped" in cell:
        return "skipped"
    return f"{cell['p50_us']:.1f} / {cell['p99_us']:.1f}"


def _table(results: dict[str, Any]) -> str:
    lines = ["| store | size (tokens) | lookup(), tree | lookup_into(), tree | lookup_into(), chain of 10 "
             "| HF-style scan | vLLM-style KMP | build (M tok/s) | bytes/token | hit rate |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results["context"]:
        lines.append(f"| context | {r['context_tokens']:,} | {_fmt(r['ours_lookup'])} "
                     f"| {_fmt(r['ours_lookup_into'])} | {_fmt(r['ours_chain'])} | {_fmt(r.get('hf_scan'))} "
                     f"| {_fmt(r.get('vllm_kmp'))} | {r['build_tokens_per_s'] / 1e6:.2f} "
                     f"| {r['bytes_per_token']:.1f} | {r['hit_rate']:.2f} |")
    for r in results["corpus"]:
        lines.append(f"| corpus | {r['corpus_tokens']:,} | {_fmt(r['ours_lookup'])} "
                     f"| {_fmt(r['ours_lookup_into'])} | {_fmt(r['ours_chain'])} | - | - "
                     f"| {r['build_tokens_per_s'] / 1e6:.2f} | {r['bytes_per_token']:.1f} "
                     f"| {r['hit_rate']:.2f} |")
    inc = results.get("incremental")
    if inc:
        lines.append(f"| corpus, one add_document per 1k-token doc | {inc['tokens']:,} | - | - | - | - | - "
                     f"| {inc['tokens_per_s'] / 1e6:.2f} | {inc['bytes_per_token']:.1f} | - |")
    lines.append("\nLatency cells: p50 / p99 microseconds per call.")
    for r in results["context"]:
        if r["context_tokens"] == 32_000:
            for name in ("hf_scan", "vllm_kmp"):
                b = r.get(name)
                if isinstance(b, dict) and "p50_us" in b:
                    lines.append(f"At 32k context, {name} / ours (lookup(), tree): p50 "
                                 f"{b['p50_us'] / r['ours_lookup']['p50_us']:.0f}x, p99 "
                                 f"{b['p99_us'] / r['ours_lookup']['p99_us']:.0f}x.")
    comp = results.get("compose")
    if comp:
        lines.append(f"Composer.compose (context + corpus + output lookups, merge, budget 16): "
                     f"p50 {comp['p50_us']:.1f} us, p99 {comp['p99_us']:.1f} us ({comp['setup']}).")
    for r in results["context"]:
        lines += [f"{n} skipped at {r['context_tokens']:,} tokens ({r[n]['skipped']})"
                  for n in ("hf_scan", "vllm_kmp") if isinstance(r.get(n), dict) and "skipped" in r[n]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from lookupspec.drafting import Composer
    from lookupspec.index import ContextIndex, CorpusIndex, LookupConfig

    ContextIndex([1, 2, 1])  # JIT warm-up / numba cache load, outside every timing
    CorpusIndex().add_document("w", [1, 2, 1])
    Composer([])
    rng = np.random.default_rng(args.seed)
    cfg = LookupConfig()
    chain_cfg = LookupConfig(width=1, max_depth=10, max_nodes=10)
    ctx_sizes = (1_000, 32_000) if args.quick else CONTEXT_SIZES
    corpus_sizes = (1_000_000,) if args.quick else CORPUS_SIZES
    n = min(args.lookups, 500) if args.quick else args.lookups
    results: dict[str, Any] = {
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                    "processor": platform.processor()},
        "config": {"tree": cfg.__dict__, "chain": chain_cfg.__dict__,
                   "hf_scan": {"max_ngram": 2, "k": 10}, "vllm_kmp": {"min_n": 1, "max_n": 4, "k": 10}},
        "context": [], "corpus": [],
    }
    for size in ctx_sizes:
        print(f"context {size:,} ...", file=sys.stderr, flush=True)
        results["context"].append(_bench_context(rng, size, n, args.baseline_budget, cfg, chain_cfg))
    for size in corpus_sizes:
        print(f"corpus {size:,} ...", file=sys.stderr, flush=True)
        results["corpus"].append(_bench_corpus(rng, size, n, cfg, chain_cfg))
    print("incremental adds ...", file=sys.stderr, flush=True)
    results["incremental"] = _bench_incremental(rng, 200_000 if args.quick else 1_000_000)
    print("composer ...", file=sys.stderr, flush=True)
    results["compose"] = _bench_compose(rng, n, cfg)
    print(_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0
