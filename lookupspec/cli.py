"""`lookupspec` command line: serve | generate | pull | bench | bench-index | bench-kernels | ...

Each sub-command lives in its own module that exposes ``configure(parser)`` and ``run(args) -> int``;
this file only wires them up, importing a module when its command is chosen (so ``--help`` and
``pull`` stay quick and never import torch).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from lookupspec import __version__

__all__ = ["COMMANDS", "build_parser", "main"]

# name -> (module, one-line help). The module's docstring first paragraph is the long description.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("lookupspec.commands.serve", "start the HTTP gateway (OpenAI-compatible API)"),
    "generate": ("lookupspec.commands.generate", "generate text for one prompt, streamed to the terminal"),
    "summarize": ("lookupspec.commands.summarize", "summarize many documents (JSONL or a folder), resumably"),
    "pull": ("lookupspec.commands.pull", "fetch and convert a named default model into the local cache"),
    "random-model": ("lookupspec.commands.random_model",
                     "a model of another's exact shape and tokenizer with random weights"),
    "bench": ("lookupspec.benchmarks.engine", "end-to-end decode benchmark against Hugging Face peers"),
    "bench-replay": ("lookupspec.benchmarks.replay", "draft budgets and batch policies on replayed outputs"),
    "bench-batch": ("lookupspec.benchmarks.batch", "step cost, throughput and exactness of batched decoding"),
    "bench-index": ("lookupspec.benchmarks.index", "lookup-store latency, build speed and memory benchmark"),
    "bench-kernels": ("lookupspec.benchmarks.kernels", "fused verification kernels vs torch twins (CUDA)"),
    "bench-gateway": ("lookupspec.benchmarks.gateway", "HTTP streaming vs in-process throughput and latency"),
    "bench-serve": ("lookupspec.benchmarks.serve", "a server under closed-loop load: tok/s, TTFT, ITL"),
    "bench-prefix": ("lookupspec.benchmarks.prefix", "TTFT and tok/s with the prefix cache on vs off"),
    "bench-linear": ("lookupspec.benchmarks.linear",
                     "CPU float32 kernels side by side: linear layers (stream vs oneDNN) or attention"),
}


def _load(module: str):
    return importlib.import_module(module)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lookupspec",
        description="Speculative decoding with lookup drafts: exact target-model output, faster.",
    )
    parser.add_argument("--version", action="version", version=f"lookupspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        if command == name:
            mod = _load(module)
            doc = (mod.__doc__ or help_text).strip().split("\n\n")[0]
            p = sub.add_parser(name, help=help_text, description=doc,
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
            mod.configure(p)
        else:
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return 2
    mod = _load(COMMANDS[args.command][0])
    try:
        return int(mod.run(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
