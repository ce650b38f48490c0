"""`python -m tools bench-replay`: greedy verification replayed from recorded outputs, per budget rule."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from tools.replay import _engine_parts, accepted_path, replay_prompt


def test_accepted_path_follows_the_output_through_the_tree():
    # root -> 5 (0) -> 6 (1) -> 7 (3); 5 -> 9 (2); root -> 8 (4)
    tokens, parents = [5, 6, 9, 7, 8], [-1, 0, 0, 1, -1]
    assert accepted_path(tokens, parents, [5, 6, 7, 1]) == [0, 1, 3]
    assert accepted_path(tokens, parents, [5, 9, 7]) == [0, 2]
    assert accepted_path(tokens, parents, [8]) == [4]
    assert accepted_path(tokens, parents, [4, 5]) == []
    assert accepted_path([], [], [1, 2]) == []


def _flat_costs(size: int = 40) -> np.ndarray:
    costs = np.full(size, 0.010)
    costs[0] = 0.0
    return costs


def test_copying_output_is_replayed_with_long_steps_and_fixed_budgets_cap_them():
    span = list(range(100, 140))
    prompt = [1, 2, 3, *span, 4, 5, 6]
    output = [7, *span]  # the answer repeats the span verbatim after one new token
    wide = replay_prompt(prompt, output, _engine_parts(), _flat_costs(), budget=32)
    narrow = replay_prompt(prompt, output, _engine_parts(), _flat_costs(), budget=2)
    adaptive = replay_prompt(prompt, output, _engine_parts(), _flat_costs(), budget=None)
    for r in (wide, narrow, adaptive):
        assert r.tokens == len(output) - 1
        assert r.plain_seconds == r.tokens * 0.010
    assert narrow.acceptance_length <= 3.0  # at most 2 accepted + 1 per step
    assert wide.acceptance_length > 4 * narrow.acceptance_length / 3
    assert wide.nodes > narrow.nodes
    assert adaptive.seconds < adaptive.plain_seconds  # flat costs: drafting pays


def test_output_without_repeats_is_one_token_per_step():
    prompt = list(range(10, 60))
    output = list(range(200, 230))
    r = replay_prompt(prompt, output, _engine_parts(), _flat_costs(), budget=8)
    assert r.steps == r.tokens == 29 and r.acceptance_length == 1.0


def test_replay_command_on_a_tiny_bench_run(tiny_models, tmp_path):
    model = str(tiny_models["tiny-llama"])
    out = tmp_path / "bench.json"
    bench = subprocess.run(
        [sys.executable, "-m", "lookupspec.cli", "bench", "--model", model, "--limit", "2",
         "--kinds", "code_edit,creative", "--max-tokens", "12", "--systems", "hf-greedy", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert bench.returncode == 0, bench.stderr[-3000:]
    replay = subprocess.run(
        [sys.executable, "-m", "tools", "bench-replay", "--from", str(out), "--model", model,
         "--budgets", "adaptive,4"],
        capture_output=True, text=True, timeout=300,
    )
    assert replay.returncode == 0, replay.stderr[-3000:]
    lines = [ln for ln in replay.stdout.splitlines() if ln.startswith("| ") and not ln.startswith("| kind")]
    kinds = {(ln.split("|")[1].strip(), ln.split("|")[2].strip()) for ln in lines}
    assert kinds == {(k, b) for k in ("code_edit", "creative", "all") for b in ("adaptive", "4")}
    assert "forward cost table (ms): 1:" in replay.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "tools", "bench-replay", "--from", str(out), "--model", model,
         "--budgets", "0"],
        capture_output=True, text=True, timeout=120,
    )
    assert bad.returncode == 2 and "budgets" in bad.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "tools", "bench-replay", "--from", str(tmp_path / "nope.json"),
         "--costs", "1:40,8:50"],
        capture_output=True, text=True, timeout=120,
    )
    assert missing.returncode == 2 and "nope.json" in missing.stderr
    assert json.loads(out.read_text())["rows"]
