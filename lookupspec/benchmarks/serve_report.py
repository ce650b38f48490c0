"""`bench-serve` results: one response's record, a pass's summary, exactness counts, tables, chart.

A *pass* is one (concurrency level, mode) run of the closed loop; mode is ``on`` / ``off``
(lookupspec's speculation) or ``server`` (another server, as configured). Everything here is pure
(no I/O but the chart), so the rules below are tested on hand-made records.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lookupspec.benchmarks.http_client import StreamedResponse, percentile, token_gaps
from lookupspec.benchmarks.prompts import BenchPrompt

__all__ = ["RULES", "count_differences", "markdown_tables", "plot_sweep", "response_record", "server_rates",
           "summarize_pass"]

RULES = {
    "ttft": "request sent to the first SSE event with text (queueing included)",
    "itl": "gaps between consecutive arrivals of text in a response (an arrival: the events of one network "
           "read); an arrival carrying k tokens contributes k gaps of gap/k (an event's tokens from the "
           "tokenizer, 1 per event without one); the first arrival contributes none",
    "output_tokens_per_s": "summed completion tokens (usage; else the counted event tokens) / the pass's "
                           "wall time, first request sent to last response ended",
    "busy_tokens_per_s": "tokens streamed (counted events) before the pass's last request was sent / that "
                         "time: every stream has a request in flight throughout, so the drain at the end of "
                         "a pass, when fewer requests than streams remain, is left out",
    "acceptance_length": "summed (accepted_tokens + steps) / summed steps over the pass's `speculation` "
                         "objects",
    "decode_tokens_per_s": "delta lookupspec_decode_tokens_total / delta lookupspec_decode_seconds_total "
                           "over the pass, /metrics scraped with the server idle before and after it",
    "exactness": "each response's text against the same prompt's at the reference level in the same mode "
                 "(and speculation on against off at the same level); greedy decoding",
    "percentiles": "nearest rank, index round(q/100*(n-1)) of the sorted values",
    "valid": "a prompt with a response_format: its response's text parses and validates against the schema "
             "(jsonschema-rs; a response cut by max_tokens is not valid)",
}


def response_record(r: StreamedResponse, prompt: BenchPrompt, client: int, pass_start: float,
                    count_tokens: Callable[[str], int] | None,
                    check: Callable[[str], str | None] | None = None) -> dict[str, Any]:
    """One response as the JSON stores it (times in seconds; ``chunk_s`` relative to sending);
    ``valid`` (None: not checked): the text follows the prompt's response_format (``check``)."""
    ok = r.error is None
    invalid = None
    if check is not None and ok:
        invalid = ("cut by max_tokens" if r.finish_reason == "length" else None) or check(r.text)
    return {
        "id": prompt.id, "kind": prompt.kind, "client": client,
        "start_s": round(r.sent - pass_start, 5),
        "ttft_s": None if r.ttft is None else round(r.ttft, 5),
        "latency_s": None if r.finished is None else round(r.finished - r.sent, 5),
        "prompt_tokens": (r.usage or {}).get("prompt_tokens"),
        "completion_tokens": r.completion_tokens,
        "finish_reason": r.finish_reason,
        "chunk_s": [round(t - r.sent, 5) for t in r.times],
        "chunk_tokens": [max(1, count_tokens(t)) for t in r.texts] if count_tokens and ok else None,
        "text": r.text,
        "speculation": r.speculation,
        "error": r.error,
        "valid": None if check is None or not ok else invalid is None,
        "invalid": invalid,
    }


_BATCH = re.compile(r'batch_size="(\d+)"')


def server_rates(delta: Mapping[str, float]) -> dict[str, Any]:
    """What lookupspec's /metrics counters say about one pass (``delta``: after - before)."""
    def g(name: str) -> float:
        return delta.get("lookupspec_" + name, 0.0)

    def by_batch(name: str) -> dict[int, float]:
        out = {}
        for key, v in delta.items():
            m = _BATCH.search(key)
            if key.startswith(f"lookupspec_{name}_total{{") and m and v:
                out[int(m.group(1))] = v
        return out

    steps = g("scheduler_steps_total")
    decode_s, decode_tokens = g("decode_seconds_total"), g("decode_tokens_total")
    spec_steps = g("spec_decode_num_steps_total")
    seqs, nodes = by_batch("batch_sequences"), by_batch("batch_draft_nodes")
    return {
        "decode_tokens": int(decode_tokens), "decode_s": round(decode_s, 4),
        "decode_tokens_per_s": round(decode_tokens / decode_s, 2) if decode_s > 0 else None,
        "prefill_s": round(g("prefill_seconds_total"), 4), "prefill_tokens": int(g("prefill_tokens_total")),
        "prefix_hit_tokens": int(g("prefix_cache_hit_tokens_total")),
        "steps": int(steps),
        "mean_batch": round(g("scheduler_step_sequences_total") / steps, 3) if steps else None,
        "mean_rows_per_step": round(g("scheduler_step_rows_total") / steps, 3) if steps else None,
        "steps_by_batch": {b: int(v) for b, v in sorted(by_batch("batch_steps").items())},
        "draft_nodes_per_sequence_by_batch": {b: round(nodes.get(b, 0.0) / n, 3)
                                              for b, n in sorted(seqs.items())},
        "acceptance_length": (round((g("spec_decode_num_accepted_tokens_total") + spec_steps) / spec_steps, 4)
                              if spec_steps else None),
        # the KV pool's growth inside the pass: every stream waited for each (0 with --kv-cache-mb)
        "kv_cache_resizes": int(g("kv_cache_resizes_total")),
        "kv_cache_resize_s": round(g("kv_cache_resize_seconds_total"), 4),
    }


def _r(value: float | None, digits: int = 5) -> float | None:
    return None if value is None else round(value, digits)


def summarize_pass(records: Sequence[Mapping[str, Any]], wall_s: float,
                   delta: Mapping[str, float] | None) -> dict[str, Any]:
    """Aggregate throughput, latency percentiles, acceptance length and server rates of one pass."""
    ok = [r for r in records if r["error"] is None]
    counted = [sum(_event_tokens(r)) for r in ok]
    tokens = sum(r["completion_tokens"] if r["completion_tokens"] is not None else c
                 for r, c in zip(ok, counted, strict=True))
    gaps, chunk_gaps = [], []
    for r in ok:
        times = r["chunk_s"]
        gaps += token_gaps(times, _event_tokens(r))
        chunk_gaps += [b - a for a, b in itertools.pairwise(times)]
    ttft = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    spec = [r["speculation"] for r in ok if r["speculation"] and r["speculation"].get("steps")]
    steps = sum(s["steps"] for s in spec)
    prompt_tokens = [r["prompt_tokens"] for r in ok if r["prompt_tokens"] is not None]
    busy_s, busy_tokens = _busy_window(records, ok)
    checked = [r for r in ok if r.get("valid") is not None]
    return {
        "requests": len(records), "errors": len(records) - len(ok), "wall_s": round(wall_s, 4),
        "output_tokens": tokens, "event_tokens_counted": sum(counted),
        "output_tokens_per_s": round(tokens / wall_s, 3) if wall_s > 0 else 0.0,
        "requests_per_s": round(len(ok) / wall_s, 4) if wall_s > 0 else 0.0,
        "busy_s": _r(busy_s, 4),
        "busy_tokens_per_s": round(busy_tokens / busy_s, 3) if busy_s else None,
        "mean_prompt_tokens": round(sum(prompt_tokens) / len(prompt_tokens), 1) if prompt_tokens else None,
        "ttft_p50_s": _r(percentile(ttft, 50)), "ttft_p99_s": _r(percentile(ttft, 99)),
        "itl_p50_s": _r(percentile(gaps, 50)), "itl_p99_s": _r(percentile(gaps, 99)),
        "chunk_gap_p50_s": _r(percentile(chunk_gaps, 50)), "chunk_gap_p99_s": _r(percentile(chunk_gaps, 99)),
        "acceptance_length": (round((sum(s["accepted_tokens"] for s in spec) + steps) / steps, 4)
                              if steps else None),
        "server": server_rates(delta) if delta is not None else None,
        "checked": len(checked), "valid": sum(bool(r["valid"]) for r in checked),
        "exactness": None, "on_vs_off": None,
    }


def _event_tokens(r: Mapping[str, Any]) -> list[int]:
    """A response's tokens per text event: counted with the tokenizer, else one per event."""
    return list(r["chunk_tokens"] or [1] * len(r["chunk_s"]))


def _busy_window(records: Sequence[Mapping[str, Any]],
                 ok: Sequence[Mapping[str, Any]]) -> tuple[float | None, int]:
    """The pass's busy window and the tokens streamed in it: from the first request sent to the last one
    sent (a closed loop keeps every stream busy until its requests run out), and the counted event
    tokens that arrived before its end. Example, times from the pass's start: requests sent at 0.0 and
    1.0, events of the first at 0.5 and 1.5 (2 and 3 tokens), of the second at 1.2: window 1.0 s,
    2 tokens. None where every request was sent at once (no window). ``ok``: the records without an
    error (every record's sending counts for the window, only theirs for the tokens)."""
    if not ok:
        return None, 0
    first = min(r["start_s"] for r in records)
    end = max(r["start_s"] for r in records)
    if end <= first:
        return None, 0
    tokens = sum(k for r in ok for t, k in zip(r["chunk_s"], _event_tokens(r), strict=True)
                 if r["start_s"] + t < end)
    return end - first, tokens


def _texts(p: Mapping[str, Any]) -> dict[str, str]:
    """A pass's text per prompt id (its first successful response)."""
    out: dict[str, str] = {}
    for r in p["responses"]:
        if r["error"] is None:
            out.setdefault(r["id"], r["text"])
    return out


def _compare(responses: Sequence[Mapping[str, Any]], reference: Mapping[str, str],
             level: int) -> dict[str, Any]:
    pairs = [(r["id"], r["text"]) for r in responses if r["error"] is None and r["id"] in reference]
    differ = sorted({i for i, text in pairs if text != reference[i]})
    return {"reference_level": level, "compared": len(pairs),
            "differ": sum(text != reference[i] for i, text in pairs), "differ_ids": differ}


def count_differences(passes: Sequence[dict[str, Any]], reference_level: int) -> None:
    """Fill each summary's ``exactness`` (vs the same mode at ``reference_level``; None for that pass
    itself) and, for speculation-on passes, ``on_vs_off`` (vs the off pass of the same level)."""
    refs = {p["mode"]: _texts(p) for p in passes if p["level"] == reference_level}
    for p in passes:
        s = p["summary"]
        if p["level"] != reference_level and p["mode"] in refs:
            s["exactness"] = _compare(p["responses"], refs[p["mode"]], reference_level)
        off = next((q for q in passes if q["level"] == p["level"] and q["mode"] == "off"), None)
        if p["mode"] == "on" and off is not None:
            s["on_vs_off"] = _compare(p["responses"], _texts(off), p["level"])


def _f(value: float | None, spec: str = ".1f", scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:{spec}}"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _pair(comparison: Mapping[str, Any] | None) -> str:
    return "-" if comparison is None else f"{comparison['differ']}/{comparison['compared']}"


def _modes(result: Mapping[str, Any]) -> list[str]:
    return list(dict.fromkeys(s["mode"] for s in result["summary"]))


def _by(result: Mapping[str, Any]) -> dict[tuple[int, str], dict[str, Any]]:
    return {(s["level"], s["mode"]): s for s in result["summary"]}


def markdown_tables(result: Mapping[str, Any]) -> str:
    """A table per mode, then speculation on against off per level (when both ran)."""
    srv, st = result["server"], result["settings"]
    by = _by(result)
    ref = st["reference_level"]
    counted = "the tokenizer" if st["tokenizer_counts_events"] else "1 token each"
    spaces = "a namespace per pass" if st.get("namespaces") == "per-pass" else "one namespace for all passes"
    lines = [f"{srv['model']} at {srv['url']} ({srv['kind']}), {result['prompts']['count']} prompts of "
             f"{result['prompts']['file']}, max_tokens {st['max_tokens']}, greedy; "
             f"ITL events counted with {counted}; {spaces}"]
    for mode in _modes(result):
        label = {"on": f"speculation on (sources: {st['sources']})", "off": "speculation off"}.get(mode, mode)
        lines += ["", f"**{label}**", "",
                  "| streams | requests | output tok/s | vs 1 stream | busy tok/s | req/s | TTFT p50 ms "
                  "| TTFT p99 ms | ITL p50 ms | ITL p99 ms | acceptance length | decode tok/s (server) "
                  "| mean batch | prefix-cache hit tokens "
                  f"| differ vs {ref} stream{'s' if ref > 1 else ''} | valid |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        base = by.get((ref, mode))
        for level in st["levels"]:
            s = by.get((level, mode))
            if s is None:
                continue
            server = s["server"] or {}
            vs = (s["output_tokens_per_s"] / base["output_tokens_per_s"]
                  if base and base["output_tokens_per_s"] else None)
            cells = [level, f"{s['requests'] - s['errors']}/{s['requests']}", _f(s["output_tokens_per_s"]),
                     _x(vs), _f(s["busy_tokens_per_s"]), _f(s["requests_per_s"], ".2f"),
                     _f(s["ttft_p50_s"], ".0f", 1000),
                     _f(s["ttft_p99_s"], ".0f", 1000), _f(s["itl_p50_s"], ".1f", 1000),
                     _f(s["itl_p99_s"], ".1f", 1000), _f(s["acceptance_length"], ".2f"),
                     _f(server.get("decode_tokens_per_s")), _f(server.get("mean_batch"), ".2f"),
                     _f(server.get("prefix_hit_tokens"), ".0f"), _pair(s["exactness"]),
                     f"{s['valid']}/{s['checked']}" if s.get("checked") else "-"]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    if {"on", "off"} <= set(_modes(result)):
        lines += ["", "**speculation on vs off**", "",
                  "| streams | output tok/s on | off | on/off | decode tok/s on | off | on/off "
                  "| texts on != off |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for level in st["levels"]:
            on, off = by.get((level, "on")), by.get((level, "off"))
            if on is None or off is None:
                continue
            d_on = (on["server"] or {}).get("decode_tokens_per_s")
            d_off = (off["server"] or {}).get("decode_tokens_per_s")
            o_on, o_off = on["output_tokens_per_s"], off["output_tokens_per_s"]
            ratio = o_on / o_off if o_off else None
            d_ratio = d_on / d_off if d_on and d_off else None
            vs = on["on_vs_off"]
            cells = [level, _f(o_on), _f(o_off), _x(ratio), _f(d_on), _f(d_off), _x(d_ratio), _pair(vs)]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def plot_sweep(result: Mapping[str, Any], path: str | Path) -> None:
    """Two panels against concurrency: output tokens/s (solid; the server's decode tokens/s dashed)
    and TTFT p50 (solid; p99 dotted), a line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    by = _by(result)
    levels = result["settings"]["levels"]
    fig, (ax_tps, ax_ttft) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    for i, mode in enumerate(_modes(result)):
        color = f"C{i}"
        xs = [lv for lv in levels if (lv, mode) in by]
        rows = [by[(lv, mode)] for lv in xs]
        label = {"on": "speculation on", "off": "speculation off"}.get(mode, mode)
        ax_tps.plot(xs, [s["output_tokens_per_s"] for s in rows], "o-", color=color, label=f"{label}: output")
        dec = [(x, (s["server"] or {}).get("decode_tokens_per_s")) for x, s in zip(xs, rows, strict=True)]
        dec = [(x, v) for x, v in dec if v is not None]
        if dec:
            ax_tps.plot(*zip(*dec, strict=True), "s--", color=color, alpha=0.6,
                        label=f"{label}: server decode")
        for key, style, suffix in (("ttft_p50_s", "o-", "p50"), ("ttft_p99_s", "^:", "p99")):
            pts = [(x, s[key]) for x, s in zip(xs, rows, strict=True) if s[key] is not None]
            if pts:
                ax_ttft.plot(*zip(*pts, strict=True), style, color=color, label=f"{label} {suffix}")
    for ax, ylabel in ((ax_tps, "tokens/s"), (ax_ttft, "TTFT (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(lv) for lv in levels])
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax_tps.set_ylim(bottom=0)
    ax_ttft.set_yscale("log")
    ax_ttft.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax_ttft.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    srv = result["server"]
    fig.suptitle(f"{srv['model']} ({srv['kind']}), {result['prompts']['count']} prompts, "
                 f"max_tokens {result['settings']['max_tokens']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
