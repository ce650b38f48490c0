"""Turning benchmark rows into results: the machine header, the per-kind summary, the markdown table
and the chart.

A *row* is one (prompt, system) measurement as written to the JSON (``id``, ``kind``, ``system``,
``seconds``, ``new_tokens``, ``tokens_per_s``, ``target_forwards``, ``tokens``, ``exact``, and
``stats`` for lookupspec). Speedups are computed per prompt (tokens/s of a system over tokens/s of
the baseline on the same prompt) and then summarised by their median, so one long prompt does not
dominate a kind.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import resource
import statistics
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["machine_info", "markdown_summary", "peak_rss_mib", "plot_summary", "summarize"]

ALL = "all"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit(root: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def missing_matplotlib(plot: Path | None) -> str | None:
    """Why ``--plot`` cannot work here (None when it can, or when no plot is asked for): checked before
    a benchmark runs, so a long run does not end in an ImportError."""
    if plot is None:
        return None
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return ("--plot needs matplotlib, which is not installed: pip install matplotlib (make install-test "
                "includes it), or run without --plot")
    return None


def peak_rss_mib() -> float:
    """Peak resident memory of this process (Linux reports ru_maxrss in KiB, macOS in bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1 << 20) if sys.platform == "darwin" else peak / 1024, 1)


def machine_info() -> dict[str, Any]:
    """Where and when the numbers were taken, for README tables to cite."""
    import numpy
    import torch
    import transformers

    import lookupspec

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "lookupspec": lookupspec.__version__,
        "git": _git_commit(Path(__file__).resolve().parents[2]),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def _median(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 4) if vals else None


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(statistics.fmean(vals), 4) if vals else None


def _speedups(rows: Sequence[Mapping[str, Any]], system: str, baseline: str) -> list[float]:
    """Per-prompt tokens/s ratios of ``system`` over ``baseline`` (prompts where both ran)."""
    base = {r["id"]: r["tokens_per_s"] for r in rows if r["system"] == baseline}
    return [r["tokens_per_s"] / base[r["id"]] for r in rows
            if r["system"] == system and base.get(r["id"])]


def _kind_summary(rows: Sequence[Mapping[str, Any]], oracle: Mapping[str, float | None],
                  systems: Sequence[str]) -> dict[str, Any]:
    ids = sorted({r["id"] for r in rows})
    out: dict[str, Any] = {"prompts": len(ids), "systems": {}}
    for system in systems:
        mine = [r for r in rows if r["system"] == system]
        if not mine:
            continue
        entry: dict[str, Any] = {
            "median_tokens_per_s": _median(r["tokens_per_s"] for r in mine),
            "median_speedup_vs_hf_greedy": _median(_speedups(rows, system, "hf-greedy")),
            "median_speedup_vs_hf_pld": _median(_speedups(rows, system, "hf-pld")),
            "median_speedup_vs_lookupspec_plain": _median(_speedups(rows, system, "lookupspec-plain")),
            # all the system's tokens over all its seconds: long outputs weigh more than in the median
            "total_tokens_per_s": (round(sum(r["new_tokens"] for r in mine) / seconds, 4)
                                   if (seconds := sum(r["seconds"] for r in mine)) > 0 else None),
            "mean_tokens_per_forward": _mean(r["new_tokens"] / r["target_forwards"]
                                             for r in mine if r["target_forwards"]),
            "mean_new_tokens": _mean(r["new_tokens"] for r in mine),
            "exact": sum(bool(r["exact"]) for r in mine),
            "rows": len(mine),
            # outputs checked against their prompt's response_format, and how many passed
            "checked": sum("valid" in r for r in mine),
            "valid": sum(r.get("valid") is True for r in mine),
        }
        out["systems"][system] = entry
    spec = [r for r in rows if r["system"] == "lookupspec" and r.get("stats")]
    acceptance = _mean(r["stats"]["acceptance_length"] for r in spec if r["stats"]["steps"])
    out["lookupspec_mean_acceptance_length"] = acceptance
    copy = _mean(oracle.get(i) for i in ids)
    out["mean_copy_oracle"] = copy
    out["acceptance_over_oracle"] = round(acceptance / copy, 4) if acceptance and copy else None
    accepted: dict[str, int] = {}
    for r in spec:
        for src, n in r["stats"].get("accepted_tokens_by_source", {}).items():
            accepted[src] = accepted.get(src, 0) + n
    total = sum(accepted.values())
    out["lookupspec_accepted_share_by_source"] = (
        {k: round(v / total, 4) for k, v in sorted(accepted.items())} if total else {})
    return out


def summarize(rows: Sequence[Mapping[str, Any]], oracle: Mapping[str, float | None],
              systems: Sequence[str]) -> dict[str, Any]:
    """Summary per kind (in first-seen order) plus ``all``; ``oracle`` maps prompt id -> copy oracle."""
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    by_kind = {k: _kind_summary([r for r in rows if r["kind"] == k], oracle, systems) for k in kinds}
    by_kind[ALL] = _kind_summary(rows, oracle, systems)
    return {"by_kind": by_kind, "peak_rss_mib": peak_rss_mib()}


def _fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown_summary(summary: Mapping[str, Any], systems: Sequence[str]) -> str:
    """Two markdown tables: per (kind, system) speed and exactness; per kind the copy statistics."""
    lines = ["| kind | system | prompts | tok/s (median) | vs hf-greedy | vs hf-pld | vs lookupspec-plain "
             "| tokens/forward | exact | valid |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, ks in summary["by_kind"].items():
        for system in systems:
            e = ks["systems"].get(system)
            if e is None:
                continue
            valid = f"{e['valid']}/{e['checked']}" if e["checked"] else "-"
            lines.append(
                f"| {kind} | {system} | {ks['prompts']} | {_fmt(e['median_tokens_per_s'], '.1f')} | "
                f"{_fmt(e['median_speedup_vs_hf_greedy'], '.2f', 'x')} | "
                f"{_fmt(e['median_speedup_vs_hf_pld'], '.2f', 'x')} | "
                f"{_fmt(e['median_speedup_vs_lookupspec_plain'], '.2f', 'x')} | "
                f"{_fmt(e['mean_tokens_per_forward'])} | {e['exact']}/{e['rows']} | "
                f"{valid} |")
    lines += ["", "| kind | acceptance length (lookupspec) | copy oracle | acceptance / oracle | "
              "accepted draft tokens by source |", "|---|---:|---:|---:|---|"]
    for kind, ks in summary["by_kind"].items():
        shares = ", ".join(f"{k} {v:.0%}" for k, v in ks["lookupspec_accepted_share_by_source"].items())
        lines.append(f"| {kind} | {_fmt(ks['lookupspec_mean_acceptance_length'])} | "
                     f"{_fmt(ks['mean_copy_oracle'])} | {_fmt(ks['acceptance_over_oracle'], '.0%')} | "
                     f"{shares or '-'} |")
    lines += ["", f"Peak RSS: {summary['peak_rss_mib']:.0f} MiB."]
    return "\n".join(lines)


def plot_summary(summary: Mapping[str, Any], systems: Sequence[str], path: str | Path, title: str) -> None:
    """Grouped bars: median tokens/s per kind (x) and system (bars), speedup over hf-greedy on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(summary["by_kind"])
    shown = [s for s in systems if any(s in summary["by_kind"][k]["systems"] for k in kinds)]
    width = 0.8 / max(len(shown), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.9 * len(kinds)), 4.2), dpi=120)
    for i, system in enumerate(shown):
        xs, ys, labels = [], [], []
        for j, kind in enumerate(kinds):
            e = summary["by_kind"][kind]["systems"].get(system)
            if e is None or e["median_tokens_per_s"] is None:
                continue
            xs.append(j - 0.4 + width * (i + 0.5))
            ys.append(e["median_tokens_per_s"])
            speedup = e["median_speedup_vs_hf_greedy"]
            labels.append("" if speedup is None or system == "hf-greedy" else f"{speedup:.1f}x")
        bars = ax.bar(xs, ys, width, label=system)
        ax.bar_label(bars, labels=labels, fontsize=7, padding=2)
    ax.set_xticks(range(len(kinds)), kinds)
    ax.set_ylabel("tokens/s (median over prompts)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, ncols=min(len(shown), 4), loc="upper left",
              title="labels: median speedup over hf-greedy", title_fontsize=7)
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
