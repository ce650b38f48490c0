"""Start the HTTP gateway. Every flag can also be set from an environment variable.

Foundation stage: the server loads the model and answers GET /health only."""

from __future__ import annotations

import argparse
import os
import sys

from lookupspec.commands.common import add_model_arguments
from lookupspec.models import ModelLoadError


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--host", default=os.environ.get("LOOKUPSPEC_HOST", "127.0.0.1"),
                        help="interface to bind [env LOOKUPSPEC_HOST]")
    parser.add_argument("--port", type=int, default=int(os.environ.get("LOOKUPSPEC_PORT", "8000")),
                        help="TCP port [env LOOKUPSPEC_PORT]")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from lookupspec.gateway.app import create_app
    from lookupspec.text import TextEngine

    try:
        te = TextEngine.load(args.model, dtype=args.dtype, device=args.device, auto_pull=True,
                             log=lambda m: print(m, file=sys.stderr))
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    app = create_app(te, model_name=te.loaded.name)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
