"""Write a model of another model's exact shape and tokenizer with random weights (for timings and
kernel checks where the real weights cannot go, such as a lent GPU machine). Nothing is downloaded:
the source is a named model (pulled), a Hugging Face directory (weights optional) or a config.json."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lookupspec.commands.common import positive_float
from lookupspec.models import ModelLoadError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="named model (e.g. smollm2-135m-instruct), Hugging Face directory "
                                       "or config.json whose shape to copy")
    parser.add_argument("out", type=Path, help="directory to write (must not exist or be empty)")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for the weights")
    parser.add_argument("--initializer-range", type=positive_float, default=None,
                        help="std of the weights' normal init; None: the config's own (0.25 gives top "
                             "logits of the usual size, where SmolLM2's 0.02 gives nearly flat ones)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="dtype of the saved weights")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="directory to copy the tokenizer files from; None: the source's")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")


def run(args: argparse.Namespace) -> int:
    from lookupspec.random_model import build_random_model

    try:
        path = build_random_model(args.source, args.out, seed=args.seed,
                                  initializer_range=args.initializer_range, dtype=args.dtype,
                                  tokenizer=args.tokenizer, force=args.force,
                                  log=lambda m: print(m, file=sys.stderr))
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0
