"""`lookupspec bench`: the copy oracle, the default prompt set, and an end-to-end run on a tiny model."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter

import pytest

from lookupspec.benchmarks.oracle import copy_oracle, copy_oracle_reference
from lookupspec.benchmarks.prompts import DEFAULT_PROMPTS, KINDS, load_prompts, select_prompts

# ------------------------------------------------------------------------------------------ copy oracle


def test_oracle_worked_example_copies_two_tokens_then_emits_the_bonus():
    result = copy_oracle([7, 8, 9, 5], [7, 8, 9, 4])
    assert (result.value, result.steps, result.target_forwards) == (3.0, 1, 2)


def test_oracle_without_repeats_is_one_token_per_step():
    result = copy_oracle([1, 2, 3], [4, 5, 6, 7, 8])
    assert (result.value, result.steps) == (1.0, 4)


def test_oracle_copies_a_prompt_span_verbatim_up_to_the_output_end():
    prompt = [10, 11, 12, 13, 14, 15, 16]
    # first token 10 comes from the prefill; then 11..16 can all be drafted from the prompt at once
    result = copy_oracle(prompt, [10, 11, 12, 13, 14, 15, 16])
    assert (result.value, result.steps) == (6.0, 1)


def test_oracle_picks_the_best_of_several_occurrences():
    # 5 occurs twice in the prompt: after the first comes 1 (wrong), after the second 6, 7 (right)
    prompt = [5, 1, 9, 5, 6, 7, 9]
    result = copy_oracle(prompt, [5, 6, 7, 3])
    assert (result.value, result.steps) == (3.0, 1)


def test_oracle_caps_the_draft_at_max_draft_tokens():
    prompt = list(range(100, 140))
    result = copy_oracle(prompt, list(range(100, 140)), max_draft=16)
    # 39 tokens after the prefill's first: steps of 17 (16 drafted + bonus), 17, then the last 5
    assert result.steps == 3
    assert result.value == pytest.approx(39 / 3)


def test_oracle_only_proposes_tokens_already_in_the_context():
    # prompt [1], output 2 2 2 2 2. Step 1 (known 1 2): no earlier 2 -> emits 1 token. Step 2 (known
    # 1 2 2): the earlier 2 is followed only by the current 2, so 1 drafted token + the bonus; copying
    # the not-yet-known future 2s would have finished here. Step 3 emits the last token.
    result = copy_oracle([1], [2, 2, 2, 2, 2])
    assert result.steps == 3
    assert result.value == pytest.approx(4 / 3)


def test_oracle_of_an_empty_or_single_token_output_is_undefined():
    assert copy_oracle([1, 2], []).value is None
    assert copy_oracle([1, 2], [3]).value is None
    assert copy_oracle([1, 2], [3]).target_forwards == 1


def test_oracle_matches_its_plain_python_reference_on_random_sequences():
    rng = random.Random(0)
    for _ in range(200):
        vocab = rng.choice([2, 3, 5, 20])
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        output = [rng.randrange(vocab) for _ in range(rng.randrange(0, 40))]
        max_draft = rng.choice([0, 1, 3, 16])
        assert copy_oracle(prompt, output, max_draft) == copy_oracle_reference(prompt, output, max_draft)


# ----------------------------------------------------------------------------------------- prompt set


def test_default_prompt_set_has_enough_prompts_of_every_kind():
    prompts = load_prompts(DEFAULT_PROMPTS)
    counts = Counter(p.kind for p in prompts)
    assert len(prompts) >= 40
    assert set(counts) == set(KINDS)
    assert all(counts[k] >= 10 for k in KINDS), counts
    assert len({p.id for p in prompts}) == len(prompts)


def test_default_prompt_rows_are_well_formed_chat_messages():
    with open(DEFAULT_PROMPTS, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    for row in rows:
        assert set(row) == {"id", "kind", "messages"}
        assert row["id"].startswith(row["kind"] + "-")
        messages = row["messages"]
        assert [m["role"] for m in messages] == ["system", "user"], row["id"]
        assert all(set(m) == {"role", "content"} and m["content"].strip() for m in messages), row["id"]
        if row["kind"] == "code_edit":
            assert "```python" in messages[-1]["content"]
        if row["kind"] == "rag_qa":
            assert "[1] Source:" in messages[-1]["content"] and "[2] Source:" in messages[-1]["content"]


def test_default_prompt_sources_are_recorded():
    sources = (DEFAULT_PROMPTS.parent / "SOURCES.md").read_text(encoding="utf-8")
    for p in load_prompts(DEFAULT_PROMPTS):
        assert f"`{p.id}`" in sources
    for line in sources.splitlines():
        for name in line.split("`licenses/")[1:]:
            name = name.split("`")[0]
            assert not name or (DEFAULT_PROMPTS.parent / "licenses" / name).is_file(), name


def test_limit_takes_prompts_round_robin_across_kinds():
    prompts = load_prompts(DEFAULT_PROMPTS)
    picked = select_prompts(prompts, limit=8)
    assert Counter(p.kind for p in picked) == {k: 2 for k in KINDS}
    only = select_prompts(prompts, kinds=["creative", "code_edit"], limit=3)
    assert [p.kind for p in only] == ["code_edit", "creative", "code_edit"]
    with pytest.raises(ValueError, match="no prompts of kind"):
        select_prompts(prompts, kinds=["poetry"])


def test_bad_prompt_file_names_the_line(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"id": "a", "kind": "k", "messages": [{"role": "user", "content": "hi"}]}\n'
                   '{"id": "b", "kind": "k", "messages": [{"role": "robot", "content": "hi"}]}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: messages\[0\]"):
        load_prompts(bad)


# --------------------------------------------------------------------------------------- end to end


def test_bench_end_to_end_on_a_tiny_model(tiny_models, tmp_path):
    # the two kinds with the shortest prompts: the tiny tokenizer makes prompts ~2x longer than SmolLM2
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = subprocess.run(
        [sys.executable, "-m", "lookupspec.cli", "bench", "--model", str(tiny_models["tiny-llama"]),
         "--limit", "2", "--kinds", "code_edit,creative", "--max-tokens", "8",
         "--systems", "lookupspec,hf-greedy,hf-pld", "--json", str(out), "--plot", str(png)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| kind | system |" in proc.stdout
    result = json.loads(out.read_text())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    machine = set(result["machine"])
    assert {"date", "cpu", "logical_cores", "torch_threads", "torch", "transformers"} <= machine
    rows = result["rows"]
    assert len(rows) == 2 * 3
    assert {(r["kind"], r["system"]) for r in rows} == {
        (k, s) for k in ("code_edit", "creative") for s in ("lookupspec", "hf-greedy", "hf-pld")}
    for r in rows:
        assert {"id", "kind", "system", "seconds", "new_tokens", "tokens_per_s", "target_forwards", "tokens",
                "exact"} <= set(r)
        assert r["new_tokens"] == len(r["tokens"]) and 1 <= r["new_tokens"] <= 8
        assert r["seconds"] > 0 and r["target_forwards"] >= 1
        assert ("stats" in r) == (r["system"] == "lookupspec")
        if r["system"] == "hf-greedy":
            assert r["exact"] is True
            assert r["target_forwards"] == r["new_tokens"]  # plain greedy: one forward per token
    for p in result["prompts"]:
        assert p["copy_oracle"] is None or p["copy_oracle"] >= 1.0
    summary = result["summary"]
    assert set(summary["by_kind"]) == {"code_edit", "creative", "all"}
    greedy = summary["by_kind"]["all"]["systems"]["hf-greedy"]
    assert greedy["median_speedup_vs_hf_greedy"] == 1.0 and greedy["exact"] == 2
    assert summary["peak_rss_mib"] > 0
    assert "hf-assisted" not in {r["system"] for r in rows}


def test_bench_batch_end_to_end_on_a_tiny_model(tiny_models, tmp_path):
    out = tmp_path / "batch.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tools", "bench-batch", "--model", str(tiny_models["tiny-llama"]),
         "--limit", "2", "--kinds", "code_edit,creative", "--max-tokens", "10", "--batch-sizes", "1,2",
         "--rows", "1,4", "--context", "64", "--rounds", "2", "--throughput-batches", "1,2",
         "--exactness-batches", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| batch | 1 rows | 4 rows |" in proc.stdout
    result = json.loads(out.read_text())
    assert result["batch_invariant"] is True and result["prompts"] == 2
    assert {(r["batch"], r["rows"]) for r in result["cost"]} == {(1, 1), (1, 4), (2, 1), (2, 4)}
    assert all(r["ms"] > 0 for r in result["cost"])
    assert {(r["drafts"], r["batch"]) for r in result["throughput"]} == {
        (d, b) for d in ("plain", "lookup") for b in (1, 2)}
    assert all(r["decode_tokens"] > 0 for r in result["throughput"])
    modes = {(r["mode"], r["batch"]) for r in result["exactness"]}
    assert modes == {("greedy", 2), ("sampled T=0.8", 2), ("greedy, plain", 2)}
    for r in result["exactness"]:  # the tiny model's logits are spread out: no near-ties, no differences
        assert r["identical"] == r["prompts"] == 2 and r["other_differences"] == 0
        assert r["margins"] == r["margin_dtype_steps"] == []
    assert {r["path"] for r in result["noise"]} == {"chain", "tree", "batched", "prefill"}
    assert all(r["identical_rows"] == r["rows"] > 0 for r in result["noise"])  # float32 on the CPU
    assert result["near_tie_epsilon"] == 1e-3
    # the lean forward's native element-wise steps against torch's ops, shape by shape
    proc = subprocess.run(
        [sys.executable, "-m", "tools", "bench-batch", "--model", str(tiny_models["tiny-llama"]),
         "--sections", "cost", "--batch-sizes", "1,2", "--rows", "1", "--context", "64", "--rounds", "2",
         "--compare-lean-native", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Speed-up of the native element-wise steps" in proc.stdout
    result = json.loads(out.read_text())
    assert set(result["cost_lean_native"]) == {"native", "torch"}
    assert result["cost"] == result["cost_lean_native"]["native"]
    assert {(r["batch"], r["rows"]) for r in result["cost_lean_native"]["torch"]} == {(1, 1), (2, 1)}


def test_bench_linear_end_to_end_on_a_tiny_model(tiny_models, tmp_path):
    from lookupspec.runtime.native import matmul

    if matmul.kernel() is None:
        pytest.skip(f"the streaming kernel does not build here: {matmul.kernel_error()}")
    out = tmp_path / "linear.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tools", "bench-linear", "--model", str(tiny_models["tiny-llama"]),
         "--rows", "1,8", "--steps", "1x1,2x3", "--contexts", "20", "--rounds", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| measured | oneDNN ms | stream ms | oneDNN / stream |" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["what"] for r in rows] == [
        "products, 1 rows", "products, 8 rows", "forward, 1 seqs x 1 rows, 20 cached",
        "forward, 2 seqs x 3 rows, 20 cached", "forward, 128-token chunk + 8 one-row seqs, 20 cached"]
    assert all(r["onednn_ms"] > 0 and r["stream_ms"] > 0 for r in rows)


def test_bench_linear_chunk_forward_keeps_the_logits_the_engine_keeps(tiny_models, tmp_path, monkeypatch):
    """The chunk forward's figure is a serving step's: logits of the 8 step rows and of the chunk's
    last row, not the LM head over all 136 rows (which the engine never computes)."""
    import argparse

    from lookupspec.runtime.native import matmul
    from lookupspec.runtime.runner import ModelRunner
    from tools import linear

    if matmul.kernel() is None:
        pytest.skip(f"the streaming kernel does not build here: {matmul.kernel_error()}")
    calls = []
    forward = ModelRunner.forward

    def spy(self, seqs, keep=None):
        out = forward(self, seqs, keep)
        calls.append(([len(s.tokens) for s in seqs], None if keep is None else keep.tolist(), out.shape[0]))
        return out

    monkeypatch.setattr(ModelRunner, "forward", spy)
    # run() sets the backend's variable for each model it loads: restored after the test
    monkeypatch.setenv("LOOKUPSPEC_CPU_LINEAR", os.environ.get("LOOKUPSPEC_CPU_LINEAR", "auto"))
    parser = argparse.ArgumentParser()
    linear.configure(parser)
    args = parser.parse_args(["--model", str(tiny_models["tiny-llama"]), "--rows", "1", "--steps", "1x1",
                              "--contexts", "20", "--rounds", "1", "--json", str(tmp_path / "a.json")])
    assert linear.run(args) == 0
    chunks = [c for c in calls if c[0] == [1] * 8 + [128]]
    assert len(chunks) == 4  # two rounds (one a warm-up) x two linear backends
    assert all(keep == [*range(8), 135] and rows == 9 for _, keep, rows in chunks)
    steps = [c for c in calls if c[0] == [1]]
    assert steps and all(keep is None and rows == 1 for _, keep, rows in steps)
