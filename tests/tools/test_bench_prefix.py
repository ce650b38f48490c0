"""`python -m tools bench-prefix`: the RAG prompt set, the interleaving, the summary rules, and an end-to-end
run of both servers on a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lookupspec.benchmarks.prompts import BenchPrompt, load_prompts
from tools.prefix import PROMPT_SETS, interleave, summarize_set


def _p(name: str) -> BenchPrompt:
    return BenchPrompt(name, "k", ({"role": "user", "content": name},))


def test_the_rag_set_is_questions_over_one_shared_context():
    prompts = load_prompts(PROMPT_SETS["rag"])
    assert 8 <= len(prompts) <= 16
    systems = {p.messages[0]["content"] for p in prompts}
    users = [p.messages[-1]["content"] for p in prompts]
    assert len(systems) == 1 and all(p.messages[0]["role"] == "system" for p in prompts)
    common = os.path.commonprefix(users)  # noqa: RUF071 - the common leading characters is what we want
    assert common.count("\n[") == 4 and common.endswith("\n\nQuestion: ")  # four passages, then the question
    assert min(len(common) / len(u) for u in users) > 0.9
    assert len(set(users)) == len(users)


def test_interleave_takes_one_of_each_set_in_turn():
    a, b = [_p("a1"), _p("a2"), _p("a3")], [_p("b1")]
    assert [(k, p.id) for k, p in interleave(a, b)] == [(0, "a1"), (1, "b1"), (0, "a2"), (0, "a3")]
    assert interleave([], []) == []


def _rec(server, prompt, ttft, tokens=10, wall=1.0, prompt_tokens=100, cached=0, text="t", error=None):
    return {"server": server, "prompt": prompt, "ttft_s": ttft, "wall_s": wall, "completion_tokens": tokens,
            "prompt_tokens": prompt_tokens, "cached_tokens": cached, "text": text, "error": error}


def test_summary_compares_warm_requests_with_the_same_prompts_uncached():
    records = [
        _rec("on", "p1", 1.0, cached=0), _rec("off", "p1", 1.0),  # the cold one fills the cache
        _rec("on", "p2", 0.2, cached=92), _rec("off", "p2", 1.1),
        _rec("on", "p3", 0.3, cached=90, wall=0.5, text="x"), _rec("off", "p3", 0.9),
        _rec("on", "p4", 0.1, cached=95, error="HTTP 500"), _rec("off", "p4", 1.0),
    ]
    s = summarize_set(records, warm_share=0.9)
    assert (s["requests"], s["errors"], s["prompts"]) == (8, 1, 3)
    assert s["warm"]["prompts"] == 2  # p2, p3 (p4 failed with the cache on)
    assert s["warm"]["on_ttft_p50_s"] == pytest.approx(0.25)
    assert s["warm"]["off_ttft_p50_s"] == pytest.approx(1.0)
    assert s["warm"]["ttft_ratio"] == pytest.approx(0.25)
    assert s["on"]["tokens_per_s"] == pytest.approx(30 / 2.5)
    assert s["off"]["tokens_per_s"] == pytest.approx(10)
    assert s["tokens_per_s_ratio"] == pytest.approx(1.2)
    assert s["on"]["cached_share"] == pytest.approx(182 / 300) and s["off"]["cached_share"] == 0
    assert s["differ"] == ["p3"]
    assert "warm" not in summarize_set(records, warm_share=None)


@pytest.mark.slow
def test_bench_prefix_runs_both_servers_and_the_cache_serves_the_shared_prefix(tiny_models, tmp_path):
    context = " ".join(f"passage sentence {i} about the harbour bikes and their docks." for i in range(12))
    shared = tmp_path / "shared.jsonl"
    rows = [{"id": f"q{i}", "kind": "rag_qa", "messages": [
        {"role": "system", "content": "Answer from the passages."},
        {"role": "user", "content": f"{context}\nQuestion {i}: what about dock {i}?"}]} for i in range(3)]
    shared.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "prefix.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tools", "bench-prefix", "--model", str(tiny_models["tiny-llama"]),
         "--shared", str(shared), "--unshared", "short", "--unshared-limit", "2", "--max-tokens", "8",
         "--warm-share", "0.5", "--threads", "1", "--serve-arg=--prefill-chunk=32", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| shared |" in proc.stdout
    result = json.loads(out.read_text())
    assert all(s["exit_status"] == 0 for s in result["servers"].values())
    assert "--no-prefix-cache" in result["servers"]["off"]["command"]
    order = [(r["prompt"], r["server"]) for r in result["records"]]
    # shared and unshared prompts interleave; within each set the first server alternates
    u0, u1 = order[2][0], result["records"][6]["prompt"]
    assert order[:6] == [("q0", "on"), ("q0", "off"), (u0, "on"), (u0, "off"), ("q1", "off"), ("q1", "on")]
    assert order[6:8] == [(u1, "off"), (u1, "on")]
    sh, un = result["summary"]["shared"], result["summary"]["unshared"]
    assert (sh["prompts"], sh["errors"], un["prompts"], un["errors"]) == (3, 0, 2, 0)
    by = {(r["prompt"], r["server"]): r for r in result["records"]}
    assert by["q0", "on"]["cached_tokens"] == 0  # the first one fills the cache
    for q in ("q1", "q2"):  # later ones reuse it: the whole 32-token chunks of the shared part
        on = by[q, "on"]
        assert on["prompt_tokens"] - 64 <= on["cached_tokens"] < on["prompt_tokens"]
        assert on["cached_tokens"] % 32 == 0
        assert by[q, "off"]["cached_tokens"] == 0
    assert sh["warm"]["prompts"] == 2 and sh["on"]["cached_share"] > 0.5
    assert un["off"]["cached_share"] == 0
    assert sh["differ"] == [] and un["differ"] == []  # greedy: the same tokens with or without the cache
    assert all(r["text"] for r in result["records"])
