"""``python -m tools <command>``: the developers' benchmarks and studies, run from a checkout.

Each command is a module of this folder with ``configure(parser)`` and ``run(args) -> int``, imported
only when chosen, like the ``lookupspec`` CLI's own commands.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from lookupspec.cli import run_commands

COMMANDS: dict[str, tuple[str, str]] = {
    "bench-replay": ("tools.replay", "draft budgets and batch policies on replayed outputs"),
    "bench-batch": ("tools.batched_decoding", "step cost, throughput and exactness of batched decoding"),
    "bench-index": ("tools.index", "lookup-store latency, build speed and memory benchmark"),
    "bench-kernels": ("tools.kernels", "fused verification kernels vs torch twins (CUDA)"),
    "bench-gateway": ("tools.gateway", "HTTP streaming vs in-process throughput and latency"),
    "bench-prefix": ("tools.prefix", "TTFT and tok/s with the prefix cache on vs off"),
    "bench-grammar": ("tools.grammar_mask_bench",
                      "grammar libraries (xgrammar, llguidance): mask, rollback and fork cost per token"),
    "bench-structured": ("tools.structured_bench",
                         "JSON-schema extraction with speculation on/off, and the grammar's cost per step"),
    "bench-linear": ("tools.linear",
                     "CPU float32 kernels side by side: linear layers (stream vs oneDNN) or attention"),
}


def main(argv: Sequence[str] | None = None) -> int:
    return run_commands(COMMANDS, "python -m tools",
                        "lookupspec's research benchmarks (not installed; run from a checkout).",
                        sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
