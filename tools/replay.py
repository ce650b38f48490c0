"""Replay a bench run's greedy outputs through the drafters: acceptance length and estimated speedup
against draft budget, one sequence at a time or in batches (--batch-sizes), without running the model.

Greedy verification is deterministic: a draft tree's accepted path is its longest root path that
spells the next tokens of the greedy output. So once ``lookupspec bench --json`` has recorded
``hf-greedy``'s tokens, each prompt can be decoded again step by step: the lookup drafters (with
their process-wide statistics and the path-score calibration, as in the engine) propose a tree, a
budget rule keeps a prefix of it, and the step accepts what the output confirms. Step costs come
from a table of forward seconds per input size, measured on the model (``--model``) or given
(``--costs``), so each budget rule gets an estimated decode speedup over plain decoding next to its
acceptance length and the copy oracle. The budget rules: ``adaptive`` (the engine's policy) or a
fixed node count N (verify the best N nodes whenever the tree has any).

With ``--batch-sizes`` the outputs are replayed in batches instead
(:mod:`tools.batched_replay`): B sequences decode in lockstep under continuous
batching, each step's draft nodes chosen across the batch by a policy (``--policies``: ``joint``, the
engine's rule; ``fixed:N``; ``off-above:N``, plain decoding above N live sequences), each step's time
estimated by a step-cost model fitted to steps measured on ``--model`` at ``--cost-contexts``, or
read from ``--costs-from`` (a ``bench-batch --json`` file), or given (``--step-cost``, ms). It reports
per batch size and policy the estimated aggregate tokens/s, the speedup over plain decoding at the
same batch size, the acceptance length and the nodes verified per sequence per step.

Example: python -m tools bench-replay --from out/bench.json --budgets adaptive,12,24
Example: python -m tools bench-replay --from out/bench.json --batch-sizes 1,4,8,16,32 --json out/replay.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lookupspec.commands.common import add_model_arguments, positive_int

__all__ = ["ReplayResult", "accepted_path", "configure", "replay_prompt", "run"]

COST_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
DEFAULT_POLICIES = "joint,fixed:4,fixed:12,off-above:4,off-above:8,stopping,hindsight,oracle"


def accepted_path(tokens: Sequence[int], parents: Sequence[int], truth: Sequence[int]) -> list[int]:
    """Indices of the tree nodes greedy verification accepts: the longest root path whose tokens are
    ``truth[0], truth[1], ...`` (siblings never share a token, so the path is unique)."""
    path: list[int] = []
    node = -1
    for want in truth:
        nxt = next((i for i, (t, p) in enumerate(zip(tokens, parents, strict=True))
                    if p == node and t == want), None)
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    return path


@dataclass(frozen=True)
class ReplayResult:
    steps: int  # decode steps (the prefill's first token excluded, as in RequestStats)
    tokens: int  # tokens the steps emitted
    nodes: int  # draft nodes verified, all steps
    seconds: float  # estimated decode time: step costs from the table
    plain_seconds: float  # the same tokens one forward each

    @property
    def acceptance_length(self) -> float | None:
        return self.tokens / self.steps if self.steps else None


def replay_prompt(prompt: Sequence[int], output: Sequence[int], engine_parts: dict[str, Any],
                  costs: np.ndarray, budget: int | None) -> ReplayResult:
    """Decode ``output`` again after ``prompt``; ``budget`` None = the adaptive policy.
    ``engine_parts`` holds ``drafting``, ``calibration``, ``policy`` and ``exploration``, shared across
    prompts as an engine shares them across requests; ``costs`` [>= 34] seconds per forward size."""
    from lookupspec.params import LOOKUP_SOURCES, SpecParams

    drafting, calibration, policy, exploration = (
        engine_parts[k] for k in ("drafting", "calibration", "policy", "exploration"))
    session = drafting.session(list(prompt), SpecParams(sources=LOOKUP_SOURCES), None)
    n, t, steps, seconds, nodes = len(output), 1, 0, 0.0, 0
    session.extend(output[:1])
    while t < n:
        room = min(n - t - 1, len(costs) - 2)
        k, tree = 0, None
        if room > 0:
            tree = session.propose(room if budget is None else min(room, budget))
            scores = calibration.apply(np.asarray(tree.score, np.float64))
            k = policy.choose(scores, costs) if budget is None else len(scores)
            k = exploration.adjust(k, len(scores))
        path: list[int] = []
        if tree is not None and k:
            sub = tree.prefix(k)
            path = accepted_path([int(x) for x in sub.tokens], [int(x) for x in sub.parents], output[t:])
            session.feedback(sub, path)
            calibration.observe_path(sub.score, path)
        emit = min(len(path) + 1, n - t)
        session.extend(output[t:t + emit])
        t += emit
        steps += 1
        nodes += k
        seconds += float(costs[k + 1])
    return ReplayResult(steps, n - 1, nodes, seconds, (n - 1) * float(costs[1]))


def _engine_parts() -> dict[str, Any]:
    from lookupspec.cost import BudgetPolicy
    from lookupspec.drafting.acceptance import Exploration, ScoreCalibration
    from lookupspec.drafting.session import LookupDrafting

    return {"drafting": LookupDrafting(), "calibration": ScoreCalibration(), "policy": BudgetPolicy(),
            "exploration": Exploration()}


def _parse_costs(text: str) -> np.ndarray:
    from lookupspec.cost import CostModel

    model = CostModel()
    for item in text.split(","):
        size, _, ms = item.partition(":")
        model.observe(int(size), float(ms) / 1000.0)
    if not model.known():
        raise ValueError("--costs must include size 1")
    return model.table(COST_SIZES[-1] + 2)


def _measure_costs(loaded: Any, args: argparse.Namespace, context: int) -> np.ndarray:
    from lookupspec.engine import Engine
    from lookupspec.runtime import prepare_models

    prepare_models(loaded.model, packed_linear=args.packed_linear)
    engine = Engine(loaded.model, context_window=loaded.context_window, lean=args.lean_forward)
    ctx = min(context, loaded.context_window - COST_SIZES[-1] - 8)
    engine.warmup(COST_SIZES, batches=(1,), context=ctx)
    return engine.cost_table(COST_SIZES[-1] + 2, ctx)


def _ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}")
    return values


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--from", dest="source", type=Path, required=True,
                        help="a `lookupspec bench --json` file (its hf-greedy rows are replayed)")
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="replay the first N hf-greedy rows of the file (None: all)")
    parser.add_argument("--budgets", default="adaptive,12,24",
                        help="one-sequence mode: comma-separated budget rules: adaptive and/or fixed "
                             "node counts")
    parser.add_argument("--costs", default=None,
                        help="one-sequence mode: forward milliseconds per input size, e.g. "
                             "1:46,8:49,16:65,32:99 (None: measured on --model at the median prompt length)")
    batch = parser.add_argument_group(
        "batched replay", "given --batch-sizes, replay B sequences in lockstep (continuous batching) per "
                          "batch size and policy; times are step-cost model estimates")
    batch.add_argument("--batch-sizes", type=_ints, default=None,
                       help="comma-separated batch sizes, e.g. 1,4,8,16,32 (None: one-sequence mode)")
    batch.add_argument("--policies", default=None,
                       help="comma-separated, besides plain (always run, the reference): joint = the "
                            "engine's rule, nodes kept across the batch while they pay for the time they "
                            "add to the step; fixed:N = each sequence verifies its best N nodes; "
                            "off-above:N = joint while at most N sequences are live, plain above; "
                            "oracle = the bound on every lookup policy: each sequence drafts what the copy "
                            "oracle would copy, so every node is accepted; hindsight = the drafters' own "
                            "trees cut in hindsight to the accepted path, the bound on choosing among them; "
                            "stopping = each sequence's best chain cut where the output leaves it, the "
                            f"bound on knowing only how far to draft (None: {DEFAULT_POLICIES})")
    batch.add_argument("--costs-from", type=Path, default=None,
                       help="step costs from the \"cost\" rows of a `bench-batch --json` file "
                            "(one context: costs taken as independent of context) or of a batched "
                            "`bench-replay --json` file (None: measured on --model)")
    batch.add_argument("--step-cost", default=None,
                       help="step-cost coefficients in ms instead, e.g. t0=20,t_seq=0.3,t_row=0.5,"
                            "t_kv=0.2,t_att=0.02 (t_kv, t_att per thousand cached positions; missing: 0)")
    batch.add_argument("--cost-contexts", type=_ints, default=[256, 1024],
                       help="measuring: cached positions per sequence (two or more tell the context "
                            "terms apart)")
    batch.add_argument("--cost-rows", type=_ints, default=[1, 4, 8, 16], help="measuring: rows per sequence")
    batch.add_argument("--cost-rounds", type=positive_int, default=5, help="measuring: interleaved rounds")
    batch.add_argument("--json", type=Path, default=None, help="write the batched results here")
    add_model_arguments(parser)


def _load_items(args: argparse.Namespace, tokenizer: Any, outputs: list[tuple[str, str, list[int]]],
                prompts: dict[str, Any]) -> list[tuple[str, list[int], list[int]]]:
    from lookupspec.models import render_chat

    items = [(kind, render_chat(tokenizer, prompts[pid].messages), out) for pid, kind, out in outputs
             if pid in prompts and len(out) >= 2]
    return items[: args.limit] if args.limit else items


def run(args: argparse.Namespace) -> int:
    from lookupspec.benchmarks.oracle import copy_oracle
    from lookupspec.benchmarks.prompts import load_prompts
    from lookupspec.models import load_model, load_tokenizer

    batched = args.batch_sizes is not None
    try:
        budgets = [None if b.strip() == "adaptive" else int(b) for b in args.budgets.split(",") if b.strip()]
        if any(b is not None and b < 1 for b in budgets) or not budgets:
            raise ValueError("budgets must be 'adaptive' or positive node counts")
        _check_mode(args, batched)
        result = json.loads(args.source.read_text(encoding="utf-8"))
        prompts = {p.id: p for p in load_prompts(result["config"]["prompts"])}
        outputs = [(r["id"], r["kind"], r["tokens"]) for r in result["rows"] if r["system"] == "hf-greedy"]
        costs = _parse_costs(args.costs) if args.costs else None
        policies = _policies(args.policies) if batched else []
        batch_costs = _batch_costs(args) if batched else None
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    loaded = None  # the model is loaded only to measure costs; it brings its tokenizer
    if (costs is None and not batched) or (batched and batch_costs is None):
        loaded = load_model(args.model, dtype=args.dtype, device=args.device, auto_pull=True,
                            log=lambda m: print(m, file=sys.stderr))
    tokenizer = loaded.tokenizer if loaded is not None else load_tokenizer(args.model, auto_pull=True)
    items = _load_items(args, tokenizer, outputs, prompts)
    if not items:
        print("error: no hf-greedy rows with prompts to replay", file=sys.stderr)
        return 2
    if batched:
        from tools.replay_report import run_batches

        return run_batches(args, items, policies, batch_costs, loaded)
    if costs is None:
        costs = _measure_costs(loaded, args, int(statistics.median(len(p) for _, p, _ in items)))
    print("forward cost table (ms): " + ", ".join(f"{n}: {1000 * costs[n]:.1f}" for n in COST_SIZES))
    print("\n| kind | budget | acceptance length | copy oracle | acceptance / oracle | nodes verified "
          "per step | est. decode speedup vs plain |\n|---|---|---:|---:|---:|---:|---:|")
    oracles = [copy_oracle(p, out).value or 1.0 for _, p, out in items]
    for budget in budgets:
        parts = _engine_parts()  # a fresh "engine" per rule: nothing learned under another rule
        by_kind: dict[str, list[tuple[ReplayResult, float]]] = {}
        for (kind, prompt, out), oracle in zip(items, oracles, strict=True):
            by_kind.setdefault(kind, []).append((replay_prompt(prompt, out, parts, costs, budget), oracle))
        for kind, rs in [*by_kind.items(), ("all", [x for v in by_kind.values() for x in v])]:
            al = statistics.mean(r.acceptance_length or 1.0 for r, _ in rs)
            orc = statistics.mean(o for _, o in rs)
            nodes = sum(r.nodes for r, _ in rs) / sum(r.steps for r, _ in rs)
            speed = statistics.median(r.plain_seconds / r.seconds for r, _ in rs if r.seconds > 0)
            print(f"| {kind} | {'adaptive' if budget is None else budget} | {al:.2f} | {orc:.2f} | "
                  f"{al / orc:.0%} | {nodes:.1f} | {speed:.2f}x |")
    return 0


def _check_mode(args: argparse.Namespace, batched: bool) -> None:
    """Options of one mode given in the other are errors, not silently ignored."""
    if batched and args.costs:
        raise ValueError("--costs is a one-sequence cost table; batches take --costs-from or --step-cost")
    if batched and args.costs_from and args.step_cost:
        raise ValueError("give --costs-from or --step-cost, not both")
    given = [name for name, value in (("--policies", args.policies), ("--costs-from", args.costs_from),
                                      ("--step-cost", args.step_cost), ("--json", args.json)) if value]
    if not batched and given:
        raise ValueError(f"{', '.join(given)} need --batch-sizes (the batched replay)")


def _policies(text: str | None) -> list[Any]:
    from tools.batched_replay import BatchPolicy

    return [BatchPolicy.parse(p) for p in (text or DEFAULT_POLICIES).split(",") if p.strip()]


def _batch_costs(args: argparse.Namespace) -> Any:
    """The batched replay's (cost fit, samples) from --step-cost or --costs-from; None: measure them."""
    from tools.replay_costs import fit_coefficients, parse_coefficients, samples_from_json

    if args.step_cost:
        return parse_coefficients(args.step_cost), []
    if args.costs_from:
        samples = samples_from_json(json.loads(args.costs_from.read_text(encoding="utf-8")))
        return fit_coefficients(samples), samples
    return None
