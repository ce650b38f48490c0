"""Aggregation of a batch job's results: running figures for the progress bar, the final text report,
and an optional PNG (per-document tokens/s and acceptance length).

Everything is computed from the records the job writes (see ``lookupspec.batch.summarize``), so the
report says exactly what the output file holds for this run. Speedup figures are estimates; the
formulas are in :mod:`lookupspec.batch.speedup`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lookupspec.batch.inputs import BadInput
from lookupspec.batch.speedup import Estimate, acceptance_estimate, fit_step_costs, measured_estimate

__all__ = ["JobReport"]


class JobReport:
    """Totals over the documents finished in this run. ``cost_table``: [n + 1] seconds of a target
    forward over n tokens (index 0 unused), the engine's cost model in-process, None over a gateway."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.records: list[dict[str, Any]] = []
        self.failures: list[tuple[str, str]] = []  # (id, error)
        self.bad_inputs: list[BadInput] = []
        self.skipped_done = 0  # documents already in the output file
        self.interrupted: str | None = None  # the signal's name when the run was cut short

    def start(self) -> None:
        """Start the clock (when the first request goes out: model loading is not the job's time)."""
        self.started = time.perf_counter()

    # ---- running figures (progress bar) -------------------------------------------------------

    def add(self, record: Mapping[str, Any]) -> None:
        self.records.append(dict(record))

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def _sum(self, group: str, key: str) -> float:
        return float(sum(r.get(group, {}).get(key) or 0 for r in self.records))

    @property
    def completion_tokens(self) -> int:
        return int(self._sum("usage", "completion_tokens"))

    @property
    def acceptance_length(self) -> float:
        steps = self._sum("speculation", "steps")
        return (self._sum("speculation", "accepted_tokens") + steps) / steps if steps else 0.0

    def postfix(self) -> dict[str, str]:
        t = max(self.elapsed(), 1e-9)
        return {"docs/s": f"{len(self.records) / t:.2f}", "tok/s": f"{self.completion_tokens / t:.1f}",
                "AL": f"{self.acceptance_length:.2f}"}

    # ---- final report -------------------------------------------------------------------------

    def estimates(self, cost_table: np.ndarray | None) -> list[Estimate]:
        """Speedup estimates vs plain decoding: measured (needs the cost model), then from the AL."""
        steps = self._sum("speculation", "steps")
        if not self.records or steps <= 0:
            return []
        mean_draft = self._sum("speculation", "draft_tokens") / steps
        timed = [r for r in self.records if r["timings"].get("decode_s") is not None]
        out: list[Estimate] = []
        if cost_table is not None and cost_table.shape[0] > 1 and cost_table[1] > 0:
            tokens = sum(max(r["usage"].get("completion_tokens", 0) - 1, 0) for r in timed)
            decode_s = sum(r["timings"]["decode_s"] for r in timed)
            measured = measured_estimate(tokens, decode_s, float(cost_table[1]))
            if measured is not None:
                out.append(measured)
            sizes = np.arange(1, cost_table.shape[0])
            step_d = float(np.interp(1 + mean_draft, sizes, cost_table[1:]))
            est = acceptance_estimate(self.acceptance_length, mean_draft, float(cost_table[1]), step_d,
                                      "engine cost model")
        else:
            pts = [(r["timings"]["decode_s"] / r["speculation"]["steps"],
                    r["speculation"]["draft_tokens"] / r["speculation"]["steps"])
                   for r in timed if r["speculation"].get("steps")]
            fit = fit_step_costs([p[0] for p in pts], [p[1] for p in pts]) if pts else None
            if fit is None:
                est = acceptance_estimate(self.acceptance_length, mean_draft, None, None, "")
            else:
                a, b = fit
                est = acceptance_estimate(self.acceptance_length, mean_draft, a, a + b * mean_draft,
                                          f"fitted over {len(pts)} documents' step times")
        if est is not None:
            out.append(est)
        return out

    def text(self, cost_table: np.ndarray | None = None) -> str:
        n = len(self.records)
        t = self.elapsed()
        lines = [f"documents: {n} summarized in {t:.1f} s ({n / t if t > 0 else 0:.3f}/s); "
                 f"{len(self.failures)} failed; {len(self.bad_inputs)} bad input entries skipped; "
                 f"{self.skipped_done} already in the output"]
        if self.interrupted:
            lines.append(f"interrupted by {self.interrupted}: the output holds every finished document; "
                         "run the same command again to resume")
        if n:
            prompt = int(self._sum("usage", "prompt_tokens"))
            comp = self.completion_tokens
            decode_s = sum(r["timings"].get("decode_s") or 0.0 for r in self.records)
            gen_s = sum(r["timings"]["total_s"] for r in self.records)
            lines.append(f"tokens: {prompt} prompt, {comp} completion; {comp / t if t > 0 else 0:.1f} "
                         f"completion tokens/s overall, {comp / gen_s if gen_s > 0 else 0:.1f} per request"
                         + (f", {comp / decode_s:.1f} while decoding" if decode_s > 0 else ""))
            lines.append(self._speculation_line())
            for est in self.estimates(cost_table):
                label = "upper bound" if est.upper_bound else "estimate"
                lines.append(f"speedup vs plain decoding ({label}): {est.speedup:.2f}x  [{est.how}]")
        for doc_id, error in self.failures[:10]:
            lines.append(f"failed: {doc_id}: {error}")
        if len(self.failures) > 10:
            lines.append(f"failed: ... and {len(self.failures) - 10} more")
        return "\n".join(lines)

    def _speculation_line(self) -> str:
        steps = int(self._sum("speculation", "steps"))
        draft = int(self._sum("speculation", "draft_tokens"))
        accepted = int(self._sum("speculation", "accepted_tokens"))
        by_source: dict[str, int] = {}
        for r in self.records:
            for k, v in (r["speculation"].get("accepted_tokens_by_source") or {}).items():
                by_source[k] = by_source.get(k, 0) + int(v)
        total = sum(by_source.values())
        shares = ", ".join(f"{k} {v / total:.1%}" for k, v in sorted(by_source.items())) if total else "none"
        rate = f" ({accepted / draft:.1%})" if draft else ""
        return (f"speculation: {steps} steps, acceptance length {self.acceptance_length:.2f}; "
                f"draft tokens {draft}, accepted {accepted}{rate}; accepted by source: {shares}")

    def plot(self, path: str | Path) -> Path:
        """Per-document tokens/s and acceptance length, in finishing order (matplotlib, Agg)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ids = [str(r["id"]) for r in self.records]
        tps = [float(r["timings"].get("tokens_per_second") or 0.0) for r in self.records]
        al = [float(r["speculation"].get("acceptance_length") or 0.0) for r in self.records]
        x = np.arange(len(ids))
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6.0, min(0.35 * len(ids), 24.0)), 6.5),
                                          sharex=True)
        top.bar(x, tps, color="tab:blue")
        top.set_ylabel("completion tokens/s")
        top.set_title(f"lookupspec summarize: {len(ids)} documents")
        bottom.bar(x, al, color="tab:green")
        bottom.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")  # plain decoding
        bottom.set_ylabel("acceptance length")
        if len(ids) <= 40:
            bottom.set_xticks(x, [i if len(i) <= 24 else i[:21] + "..." for i in ids], rotation=60,
                              ha="right", fontsize=7)
        else:
            bottom.set_xlabel("document (finishing order)")
        fig.tight_layout()
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
        plt.close(fig)
        return out
