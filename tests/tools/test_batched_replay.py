"""`python -m tools bench-replay --batch-sizes`: recorded greedy outputs replayed B at a time, the draft
nodes chosen per policy, step times from a step-cost model with coefficients given directly."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lookupspec.benchmarks.oracle import copy_oracle
from lookupspec.drafting.acceptance import Exploration
from tools.batched_replay import BatchPolicy, ReplayItem, replay_batch
from tools.replay import _engine_parts, replay_prompt
from tools.replay_costs import (
    CostSample,
    cost_model,
    fit_coefficients,
    parse_coefficients,
    samples_from_json,
)

ROOT = Path(__file__).resolve().parents[2]
# t0 20 ms, a row 0.5 ms: drafting pays at small batches (a SmolLM2-on-CPU-like shape)
COSTS = "t0=20,t_seq=0.3,t_row=0.5,t_kv=0.2,t_att=0.05"


def _mixed(n: int = 12, seed: int = 0) -> list[ReplayItem]:
    """Outputs that copy a span of the prompt, copy it with 15% of tokens changed, or are new text."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        span = [rng.randrange(100, 400) for _ in range(60)]
        prompt = [rng.randrange(1, 99) for _ in range(30)] + span + [rng.randrange(1, 99) for _ in range(20)]
        if i % 3 == 0:
            out = [rng.randrange(500, 900) for _ in range(50)]
        elif i % 3 == 1:
            out = [7, *span[5:45]]
        else:
            out = [8] + [t if rng.random() < 0.85 else rng.randrange(500, 900) for t in span[:50]]
        items.append(ReplayItem(f"k{i % 3}", tuple(prompt), tuple(out)))
    return items


def _low_acceptance(n: int = 24, seed: int = 1) -> list[ReplayItem]:
    """Outputs that follow the prompt's tokens only half the time: lookups find matches that rarely pay."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        span = [rng.randrange(100, 160) for _ in range(60)]
        out = [9] + [t if rng.random() < 0.5 else rng.randrange(100, 160) for t in span[:40]]
        items.append(ReplayItem("low", tuple(span), tuple(out)))
    return items


def _model(text: str = COSTS):
    return cost_model(parse_coefficients(text))


def _single(items: list[ReplayItem], model) -> list[tuple[int, int, int]]:
    parts = _engine_parts()
    table = model.table(33, 0)  # 32 nodes at most, as the engine's max_draft_tokens
    return [(r.steps, r.tokens, r.nodes) for r in
            (replay_prompt(list(it.prompt), list(it.output), parts, table, None) for it in items)]


def _batched(items: list[ReplayItem], model, batch: int = 1,
             policy: str = "joint") -> list[tuple[int, int, int]]:
    r = replay_batch(items, batch, BatchPolicy.parse(policy), model)
    return [(s.steps, s.tokens, s.nodes) for s in r.sequences]


def test_policies_parse_and_refuse_bad_names():
    assert BatchPolicy.parse("joint") == BatchPolicy("joint")
    assert BatchPolicy.parse(" fixed:4 ").label == "fixed:4"
    assert BatchPolicy.parse("off-above:8") == BatchPolicy("off-above", 8)
    assert BatchPolicy.parse("oracle") == BatchPolicy("oracle")
    assert BatchPolicy.parse("hindsight").label == "hindsight"
    assert BatchPolicy.parse("stopping").label == "stopping"
    for bad in ("fixed", "fixed:0", "joint:3", "off-above:x", "adaptive", "oracle:2", "hindsight:4",
                "stopping:1"):
        with pytest.raises(ValueError, match="policy"):
            BatchPolicy.parse(bad)


def test_batch_of_one_joint_equals_the_single_sequence_adaptive_replay_when_costs_ignore_context():
    # Same drafters, calibration, exploration and rule (k* = argmax (1 + sum s[:k]) / T(1 + k)). With
    # rows cheap enough that no tree is refused whole, every prompt replays step for step the same.
    model = _model("t0=20,t_row=0.05")
    items = _mixed()
    assert _batched(items, model) == _single(items, model)


def test_batch_of_one_joint_equals_the_single_replay_also_when_trees_are_refused():
    # With rows expensive enough for refusals: a tree the policy refuses whole is not fed back (it was
    # never verified), as in the one-sequence replay: feeding it back as all rejected would teach the
    # drafters a verdict the target never gave.
    model = _model("t0=20,t_row=6")
    items = _mixed()
    assert _batched(items, model) == _single(items, model)


def test_plain_emits_exactly_one_token_per_sequence_per_step():
    items = _mixed(7)
    for batch in (1, 3, 8):
        r = replay_batch(items, batch, BatchPolicy("plain"), _model())
        assert all(s.nodes == 0 and s.tokens == s.live for s in r.log)
        assert r.acceptance_length == 1.0 and r.nodes_per_sequence_step == 0.0
        assert r.tokens == sum(len(it.output) - 1 for it in items)


def test_continuous_batching_replays_every_prompt_once_and_keeps_the_batch_full_until_the_file_runs_out():
    items = _mixed(11)
    for batch in (1, 4, 16):
        for policy in ("plain", "joint", "fixed:4"):
            r = replay_batch(items, batch, BatchPolicy.parse(policy), _model())
            assert [s.tokens for s in r.sequences] == [len(it.output) - 1 for it in items]
            assert all(s.steps >= 1 for s in r.sequences)
            lives = [s.live for s in r.log]
            first_short = next((i for i, n in enumerate(lives) if n < min(batch, len(items))), len(lives))
            assert set(lives[:first_short]) == {min(batch, len(items))}
            assert all(a >= b for a, b in zip(lives[first_short:], lives[first_short + 1:], strict=False))
            assert r.sequence_steps == sum(s.steps for s in r.sequences)


def test_off_above_n_is_plain_while_more_than_n_sequences_are_live_and_joint_otherwise():
    items, model = _mixed(12), _model()
    plain = replay_batch(items, 6, BatchPolicy("plain"), model)
    off = replay_batch(items, 6, BatchPolicy("off-above", 3), model)
    above = [s for s in off.log if s.live > 3]
    assert above and all(s.nodes == 0 and s.tokens == s.live for s in above)
    # until the batch drains to N it steps exactly as plain decoding does
    assert above == [s for s in plain.log if s.live > 3][:len(above)]
    assert any(s.nodes for s in off.log if s.live <= 3)  # the drain speculates again, as vLLM would
    for batch in (1, 3):
        assert _batched(items, model, batch, "off-above:3") == _batched(items, model, batch, "joint")


def test_fixed_budget_verifies_at_most_n_nodes_per_sequence():
    items, model = _mixed(), _model()
    narrow = replay_batch(items, 4, BatchPolicy("fixed", 2), model)
    wide = replay_batch(items, 4, BatchPolicy("fixed", 12), model)
    assert all(s.nodes <= 2 * s.live for s in narrow.log)
    assert narrow.acceptance_length <= 3.0 and wide.acceptance_length > narrow.acceptance_length
    assert wide.nodes_per_sequence_step > narrow.nodes_per_sequence_step


def test_joint_beats_plain_at_every_batch_size_on_text_that_copies():
    items, model = _mixed(), _model()
    for batch in (1, 2, 4, 8):
        plain = replay_batch(items, batch, BatchPolicy("plain"), model)
        joint = replay_batch(items, batch, BatchPolicy("joint"), model)
        assert joint.tokens_per_s > plain.tokens_per_s


def test_the_oracle_steps_as_the_copy_oracle_and_every_node_it_drafts_is_accepted():
    # rows cheap enough that every sure node pays: at any batch size each sequence takes exactly the
    # copy oracle's steps (same 32-token cap as the engine), and emits one token per node plus the bonus
    items, model = _mixed(), _model("t0=20,t_row=0.05")
    want = [copy_oracle(it.prompt, it.output, max_draft=32).steps for it in items]
    for batch in (1, 4):
        r = replay_batch(items, batch, BatchPolicy("oracle"), model)
        assert [s.steps for s in r.sequences] == want
        assert [s.tokens for s in r.sequences] == [len(it.output) - 1 for it in items]
        assert all(s.tokens == s.live + s.nodes for s in r.log)  # nothing drafted was rejected


def test_the_oracle_bounds_every_policy_and_its_gain_shrinks_with_the_batch():
    items, model = _mixed(24), _model("t0=20,t_row=1")
    gains = []
    for batch in (1, 4, 16):
        plain = replay_batch(items, batch, BatchPolicy("plain"), model).tokens_per_s
        oracle = replay_batch(items, batch, BatchPolicy("oracle"), model).tokens_per_s
        for policy in ("joint", "fixed:4", "fixed:12"):
            assert replay_batch(items, batch, BatchPolicy.parse(policy), model).tokens_per_s <= oracle
        gains.append(oracle / plain)
    assert gains[0] > gains[1] > gains[2] > 1.0


def test_hindsight_accepts_what_verifying_the_whole_proposed_tree_would_and_verifies_only_that():
    # the same trees as a fixed budget of the whole room (32 nodes), the same feedback to the
    # drafters: step for step the same tokens, but only the accepted path is verified
    items, model = _mixed(), _model()
    for batch in (1, 4):
        whole = replay_batch(items, batch, BatchPolicy("fixed", 32), model)
        cut = replay_batch(items, batch, BatchPolicy("hindsight"), model)
        assert [(s.steps, s.tokens) for s in cut.sequences] == [(s.steps, s.tokens) for s in whole.sequences]
        assert all(s.tokens == s.live + s.nodes for s in cut.log)  # nothing drafted was rejected
        assert cut.nodes_per_sequence_step < whole.nodes_per_sequence_step
        joint = replay_batch(items, batch, BatchPolicy("joint"), model)
        oracle = replay_batch(items, batch, BatchPolicy("oracle"), model)
        assert joint.tokens_per_s < cut.tokens_per_s <= oracle.tokens_per_s


def test_stopping_drafts_the_best_chain_only_as_far_as_the_output_follows_it(monkeypatch):
    # each step's draft is the session's chain_only proposal cut where the output leaves it: a chain,
    # nothing rejected, and between the engine's choice and the copy oracle
    from lookupspec.drafting.session import LookupSession

    asked: list[bool] = []
    propose = LookupSession.propose

    def spy(self, max_nodes, chain_only=False):
        asked.append(chain_only)
        return propose(self, max_nodes, chain_only)

    monkeypatch.setattr(LookupSession, "propose", spy)
    items, model = _mixed(), _model()
    for batch in (1, 4):
        asked.clear()
        stop = replay_batch(items, batch, BatchPolicy("stopping"), model)
        assert asked and all(asked)
        assert all(s.tokens == s.live + s.nodes for s in stop.log)  # nothing drafted was rejected
        assert stop.nodes_per_sequence_step > 0
        joint = replay_batch(items, batch, BatchPolicy("joint"), model)
        oracle = replay_batch(items, batch, BatchPolicy("oracle"), model)
        assert joint.tokens_per_s < stop.tokens_per_s <= oracle.tokens_per_s


def test_the_joint_trees_shrink_as_the_batch_grows():
    items, model = _mixed(24), _model("t0=20,t_row=1")
    nodes = [replay_batch(items, b, BatchPolicy("joint"), model).nodes_per_sequence_step for b in (1, 4, 16)]
    assert nodes[0] > nodes[1] > nodes[2]


def test_joint_never_estimates_below_plain_by_more_than_its_exploration():
    """Low-acceptance text with rows at 15% of t0 (a pessimistic CPU): where no node pays, the joint
    policy costs at most its exploration, 2 nodes once every 8 refused steps whatever the batch size
    (it was 2 nodes on ~B/8 sequences every step before exploration counted steps: 4% below plain at
    B=4, 7% at B=8)."""
    items, model = _low_acceptance(), _model("t0=20,t_row=3")
    for batch in (1, 4, 8):
        plain = replay_batch(items, batch, BatchPolicy("plain"), model)
        joint = replay_batch(items, batch, BatchPolicy("joint"), model)
        exploration = 2 * 3 / (8 * (20 + 3 * batch))  # its rows' share of a plain step
        assert joint.tokens_per_s >= (1 - exploration) * plain.tokens_per_s, batch


def test_without_exploration_joint_stays_at_plain_where_drafts_do_not_pay(monkeypatch):
    # The same set as above with the exploration off: the threshold keeps few nodes. Not exactly
    # plain: steps act on scores the calibration is still learning (it learns only from verified
    # nodes) and lose up to a few tenths of a percent.
    monkeypatch.setattr(Exploration, "adjust_batch", lambda self, keep, available: list(keep))
    items, model = _low_acceptance(), _model("t0=20,t_row=3")
    for batch in (1, 4, 8):
        plain = replay_batch(items, batch, BatchPolicy("plain"), model)
        joint = replay_batch(items, batch, BatchPolicy("joint"), model)
        assert joint.tokens_per_s >= 0.997 * plain.tokens_per_s, batch
        assert joint.nodes_per_sequence_step < 0.15


def test_cost_model_predicts_with_the_given_coefficients():
    fit = parse_coefficients("t0=20,t_seq=0.3,t_row=0.5,t_kv=0.2,t_att=0.05")
    assert fit.coefficients["t0"] == pytest.approx(0.020) and fit.coefficients["t_att"] == pytest.approx(5e-5)
    model = cost_model(fit)
    assert model.known()
    # 3 sequences, 1 + 4 + 2 rows, caches of 100, 900, 2000 positions
    want = 20 + 0.3 * 3 + 0.5 * 7 + 0.2 * 3.0 + 0.05 * (0.1 + 3.6 + 4.0)
    assert 1000 * model.predict([1, 4, 2], [100, 900, 2000]) == pytest.approx(want, rel=2e-3)
    for bad in ("t0=20,t_x=1", "t0=-1,t_row=1", "t_row=1", "t0"):
        with pytest.raises(ValueError, match="step-cost"):
            parse_coefficients(bad)


def test_fit_recovers_coefficients_from_steps_at_two_contexts_and_drops_context_terms_at_one():
    true = {"t0": 0.02, "t_seq": 0.0004, "t_row": 0.0006, "t_kv": 0.0003, "t_att": 0.0001}
    shapes = [(b, r, c) for b in (1, 4, 16) for r in (1, 4, 8) for c in (256, 1024)]

    def seconds(b, r, c):
        return (true["t0"] + true["t_seq"] * b + true["t_row"] * b * r + true["t_kv"] * b * c / 1000
                + true["t_att"] * b * r * c / 1000)

    fit = fit_coefficients([CostSample(b, r, c, seconds(b, r, c)) for b, r, c in shapes])
    assert fit.context_terms and fit.contexts == (256, 1024) and fit.max_error < 1e-9
    for k, v in true.items():
        assert fit.coefficients[k] == pytest.approx(v, rel=1e-6)
    one = fit_coefficients([CostSample(b, r, None, seconds(b, r, 1000)) for b, r, _ in shapes[::2]])
    assert not one.context_terms and one.coefficients["t_kv"] == one.coefficients["t_att"] == 0.0
    assert one.coefficients["t_row"] == pytest.approx(true["t_row"] + true["t_att"], rel=1e-6)


def test_cost_rows_are_read_from_a_bench_batch_json():
    result = {"cost": [{"batch": 1, "rows": 1, "total_rows": 1, "ms": 20.0, "rows_per_s": 50.0},
                       {"batch": 4, "rows": 4, "context": 512, "ms": 30.0}]}
    assert samples_from_json(result) == [CostSample(1, 1, None, 0.020), CostSample(4, 4, 512, 0.030)]
    with pytest.raises(ValueError, match="cost"):
        samples_from_json({"throughput": []})


@pytest.fixture()
def bench_file(tmp_path: Path) -> tuple[Path, Path]:
    """A synthetic `lookupspec bench --json` file over six prompts (three outputs copy their prompt),
    and a model directory that holds only the fixture tokenizer (replays never load weights)."""
    from lookupspec.models import load_tokenizer, render_chat

    model = tmp_path / "tokenizer-only"
    model.mkdir()
    shutil.copy(ROOT / "fixtures" / "models" / "tiny-llama" / "config.json", model)
    for f in (ROOT / "fixtures" / "tokenizer").iterdir():
        shutil.copy(f, model)
    rng = random.Random(0)
    texts = [" ".join(f"w{rng.randrange(50)}" for _ in range(40)) for _ in range(6)]
    prompts = [{"id": f"p{i}", "kind": "copy" if i % 2 else "free",
                "messages": [{"role": "user", "content": text}]} for i, text in enumerate(texts)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    tokenizer = load_tokenizer(str(model))
    rows = []
    for p in prompts:
        ids = render_chat(tokenizer, p["messages"])
        out = ids[5:35] if p["kind"] == "copy" else [rng.randrange(10, 200) for _ in range(30)]
        rows.append({"id": p["id"], "kind": p["kind"], "system": "hf-greedy", "tokens": out})
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"config": {"prompts": str(tmp_path / "prompts.jsonl")}, "rows": rows}))
    return bench, model


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools", "bench-replay", *args],
                          capture_output=True, text=True, timeout=300)


def test_batched_replay_command_reports_every_batch_size_and_policy(bench_file, tmp_path):
    bench, model = bench_file
    out = tmp_path / "replay.json"
    r = _cli("--from", str(bench), "--model", str(model), "--batch-sizes", "1,4", "--policies",
             "joint,fixed:4,off-above:2", "--step-cost", COSTS, "--limit", "5", "--json", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "not a measurement" in r.stdout and "step-cost model (given)" in r.stdout
    table = [ln.split("|") for ln in r.stdout.splitlines()
             if ln.startswith("| ") and not ln.startswith("| batch")]
    assert {(c[1].strip(), c[2].strip()) for c in table} == {
        (b, p) for b in ("1", "4") for p in ("plain", "joint", "fixed:4", "off-above:2")}
    result = json.loads(out.read_text())
    assert result["prompts"] == 5 and result["coefficients_ms"]["t0"] == 20.0
    rows = {(x["batch"], x["policy"]): x for x in result["results"]}
    assert rows[(4, "off-above:2")]["full_batch_speedup_vs_plain"] == 1.0
    assert rows[(1, "off-above:2")]["tokens_per_s"] == rows[(1, "joint")]["tokens_per_s"]
    assert all(x["speedup_vs_plain"] == 1.0 and x["acceptance_length"] == 1.0
               for x in result["results"] if x["policy"] == "plain")
    # a bench-batch --json file's cost rows (one context) fit the model instead
    costs = tmp_path / "batch.json"
    costs.write_text(json.dumps({"cost": [{"batch": b, "rows": n, "ms": 20 + 0.4 * b + 0.6 * b * n}
                                          for b in (1, 2, 4) for n in (1, 4, 8)]}))
    r = _cli("--from", str(bench), "--model", str(model), "--batch-sizes", "2", "--costs-from", str(costs))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "one context measured: costs taken as independent of context" in r.stdout
    assert "t_row 0.600" in r.stdout and "off-above:8" in r.stdout  # the default policies


def test_batched_replay_command_refuses_options_of_the_other_mode(bench_file):
    bench, model = bench_file
    for args, message in ((["--policies", "joint"], "need --batch-sizes"),
                          (["--batch-sizes", "2", "--costs", "1:40,8:50"], "--costs"),
                          (["--batch-sizes", "2", "--policies", "fixed:0", "--step-cost", COSTS], "fixed"),
                          (["--batch-sizes", "2", "--step-cost", "t0=1,bogus=2"], "step-cost")):
        r = _cli("--from", str(bench), "--model", str(model), *args)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)


def test_step_costs_are_measured_on_the_model_with_bench_batchs_measurement(tiny_models) -> None:
    """bench-replay's measured costs (--cost from the model): every (batch, rows) at every context,
    through bench-batch's cost section."""
    from lookupspec.engine import Engine
    from lookupspec.models import load_model
    from tools.replay_costs import measure_samples

    engine = Engine(load_model(str(tiny_models["tiny-llama"])).model, max_slots=4)
    samples = measure_samples(engine, list(range(3, 40)), [1, 2], [1, 3], [16, 48], rounds=1)
    assert sorted((s.batch, s.rows, s.context) for s in samples) == sorted(
        (b, r, c) for b in (1, 2) for r in (1, 3) for c in (16, 48))
    assert all(s.seconds > 0 for s in samples)
