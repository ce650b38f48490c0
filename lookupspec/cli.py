"""`lookupspec` command line: serve | generate | summarize | pull | random-model | bench | bench-serve.

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

__all__ = ["COMMANDS", "build_parser", "main", "run_commands"]

DESCRIPTION = "Speculative decoding with lookup drafts: exact target-model output, faster."

# name -> (module, one-line help). The module's docstring first paragraph is the long description.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("lookupspec.commands.serve", "start the HTTP gateway (OpenAI-compatible API)"),
    "generate": ("lookupspec.commands.generate", "generate text for one prompt, streamed to the terminal"),
    "summarize": ("lookupspec.commands.summarize", "summarize many documents (JSONL or a folder), resumably"),
    "pull": ("lookupspec.commands.pull", "fetch and convert a named default model into the local cache"),
    "random-model": ("lookupspec.commands.random_model",
                     "a model of another's exact shape and tokenizer with random weights"),
    "bench": ("lookupspec.benchmarks.engine", "end-to-end decode benchmark against Hugging Face peers"),
    "bench-serve": ("lookupspec.benchmarks.serve", "a server under closed-loop load: tok/s, TTFT, ITL"),
}


def _load(module: str):
    return importlib.import_module(module)


def build_parser(command: str | None = None, commands: dict[str, tuple[str, str]] = COMMANDS,
                 prog: str = "lookupspec",
                 description: str = DESCRIPTION) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--version", action="version", version=f"lookupspec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in commands.items():
        if command == name:
            mod = _load(module)
            doc = (mod.__doc__ or help_text).strip().split("\n\n")[0]
            p = sub.add_parser(name, help=help_text, description=doc,
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
            mod.configure(p)
        else:
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def run_commands(commands: dict[str, tuple[str, str]], prog: str, description: str,
                 argv: Sequence[str]) -> int:
    """Parse ``argv`` against ``commands`` and run the chosen one (also ``python -m tools``)."""
    args_list = list(argv)
    command = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(command if command in commands else None, commands, prog, description)
    args = parser.parse_args(args_list)
    if args.command is None:
        parser.print_help()
        return 2
    mod = _load(commands[args.command][0])
    try:
        return int(mod.run(args) or 0)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    return run_commands(COMMANDS, "lookupspec", DESCRIPTION, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
