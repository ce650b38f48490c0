"""Aggregation of a batch job's results: running figures for the progress bar, the final text report,
and an optional PNG (per-document tokens/s and acceptance length).

The report's figures come from the records this run wrote (see ``lookupspec.summarize.job``) and,
for the speedup over plain decoding, from the plain-decoding sample the run took
(:mod:`lookupspec.summarize.speedup`). When the output file already held results of earlier runs, one
more line totals the whole file, and the plot covers the whole file: a rerun that finds nothing left
to do still reports on, and plots, what the output holds.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lookupspec.summarize.inputs import BadInput
from lookupspec.summarize.speedup import STEP_RATIO, PlainSample, Speedup, decode_wall_time, measure_speedup

__all__ = ["JobReport"]


class JobReport:
    """Totals over the documents finished in this run, and its plain-decoding sample."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.records: list[dict[str, Any]] = []
        self.failures: list[tuple[str, str]] = []  # (id, error)
        self.bad_inputs: list[BadInput] = []
        self.skipped_done = 0  # documents already in the output file
        self.interrupted: str | None = None  # the signal's name when the run was cut short
        self.plain_samples: list[PlainSample] = []  # documents decoded again without speculation
        self.concurrency = 1  # documents in flight at once (the job's --concurrency)

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

    def speedup(self) -> Speedup | None:
        """The speedup over plain decoding (:mod:`lookupspec.summarize.speedup`); None without a sample."""
        timed = [r for r in self.records if r["timings"].get("decode_s") is not None]
        tokens = sum(max(int(r["usage"].get("completion_tokens", 0)) - 1, 0) for r in timed)
        windows = [r["timings"]["decode_window"] for r in timed if r["timings"].get("decode_window")]
        if len(windows) == len(timed) and windows:  # documents in flight together: the wall time decoding
            decode_s = decode_wall_time(windows)
        else:
            decode_s = float(sum(r["timings"]["decode_s"] for r in timed))
        steps = [(str(r["id"]), r["timings"]["decode_s"] / r["speculation"]["steps"]) for r in timed
                 if (r.get("speculation") or {}).get("steps") and r["timings"]["decode_s"] > 0]
        low, high = STEP_RATIO  # a batched step serves up to `concurrency` documents
        return measure_speedup(self.plain_samples, tokens, decode_s, steps,
                               step_ratio=(low, high * max(self.concurrency, 1)))

    def text(self, output_records: Sequence[Mapping[str, Any]] = (), output_name: str = "the output") -> str:
        """The final report. ``output_records``: every record of the output file, for the line that
        totals the whole file when it held earlier results (``skipped_done``)."""
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
            lines.append(self._speculation_line(self.records))
            lines.append(self._speedup_line())
        if self.skipped_done and output_records:
            comp = int(sum((r.get("usage") or {}).get("completion_tokens") or 0 for r in output_records))
            lines.append(f"output: {len(output_records)} documents in {output_name}, {comp} completion "
                         f"tokens; " + self._speculation_line(output_records))
        for doc_id, error in self.failures[:10]:
            lines.append(f"failed: {doc_id}: {error}")
        if len(self.failures) > 10:
            lines.append(f"failed: ... and {len(self.failures) - 10} more")
        return "\n".join(lines)

    @staticmethod
    def _speculation_line(records: Sequence[Mapping[str, Any]]) -> str:
        def total(key: str) -> int:
            return int(sum((r.get("speculation") or {}).get(key) or 0 for r in records))

        steps, draft, accepted = total("steps"), total("draft_tokens"), total("accepted_tokens")
        by_source: dict[str, int] = {}
        for r in records:
            for k, v in ((r.get("speculation") or {}).get("accepted_tokens_by_source") or {}).items():
                by_source[k] = by_source.get(k, 0) + int(v)
        n = sum(by_source.values())
        shares = ", ".join(f"{k} {v / n:.1%}" for k, v in sorted(by_source.items())) if n else "none"
        rate = f" ({accepted / draft:.1%})" if draft else ""
        al = (accepted + steps) / steps if steps else 0.0
        return (f"speculation: {steps} steps, acceptance length {al:.2f}; "
                f"draft tokens {draft}, accepted {accepted}{rate}; accepted by source: {shares}")

    def _speedup_line(self) -> str:
        figure = self.speedup()
        if figure is None:
            return ("speedup vs plain decoding: not measured (no document of this run was decoded again "
                    "without speculation)")
        if figure.unreliable:
            return (f"speedup vs plain decoding: {figure.speedup:.2f}x, UNRELIABLE: {figure.unreliable} "
                    f"[{figure.how}]")
        return f"speedup vs plain decoding: {figure.speedup:.2f}x [measured: {figure.how}]"

    def plot(self, path: str | Path, records: Sequence[Mapping[str, Any]] | None = None) -> Path:
        """Per-document tokens/s and acceptance length of ``records`` (default: this run's), in their
        order (matplotlib, Agg)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        records = self.records if records is None else records
        ids = [str(r.get("id")) for r in records]
        tps = [float((r.get("timings") or {}).get("tokens_per_second") or 0.0) for r in records]
        al = [float((r.get("speculation") or {}).get("acceptance_length") or 0.0) for r in records]
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
            bottom.set_xlabel("document (output order)")
        fig.tight_layout()
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
        plt.close(fig)
        return out
