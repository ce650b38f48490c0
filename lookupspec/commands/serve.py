"""Start the HTTP gateway: OpenAI-compatible completions and chat, the documents API, /health, /ready
and /metrics. Every flag can also be set from the environment variable named in its help.

The shared store is embedded (an append-only log under --data-dir) unless --redis-url is given; then
every replica on that Redis shares documents and output caches. SIGTERM stops accepting requests,
lets in-flight ones finish (up to --drain-timeout seconds) and exits with status 0."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lookupspec.commands.common import add_model_arguments
from lookupspec.models import ModelLoadError

_ENV = "LOOKUPSPEC_"


def _env(name: str, default: Any, convert: Callable[[str], Any] = str) -> Any:
    raw = os.environ.get(_ENV + name)
    if raw is None or raw == "":
        return default
    try:
        return convert(raw)
    except ValueError:
        raise SystemExit(f"error: environment variable {_ENV + name}={raw!r} is not valid") from None


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    home = Path(os.environ.get("LOOKUPSPEC_HOME", Path.home() / ".cache" / "lookupspec")).expanduser()
    a = parser.add_argument
    a("--draft-model", default=_env("DRAFT_MODEL", None),
      help="draft model (same tokenizer) or self:layers=K / self:int8 [env LOOKUPSPEC_DRAFT_MODEL]")
    a("--served-model-name", default=_env("SERVED_MODEL_NAME", None),
      help="the id clients send as `model`; unset: the model's name [env LOOKUPSPEC_SERVED_MODEL_NAME]")
    a("--host", default=_env("HOST", "127.0.0.1"), help="interface to bind [env LOOKUPSPEC_HOST]")
    a("--port", type=int, default=_env("PORT", 8000, int), help="TCP port [env LOOKUPSPEC_PORT]")
    a("--data-dir", type=Path, default=_env("DATA_DIR", home / "data", Path),
      help="embedded store directory (unused with --redis-url) [env LOOKUPSPEC_DATA_DIR]")
    a("--redis-url", default=_env("REDIS_URL", None),
      help="share the store through Redis (redis://host:port/db) [env LOOKUPSPEC_REDIS_URL]")
    a("--redis-prefix", default=_env("REDIS_PREFIX", "lookupspec:"),
      help="key prefix of the Redis streams [env LOOKUPSPEC_REDIS_PREFIX]")
    a("--redis-stream-maxlen", type=_positive, default=_env("REDIS_STREAM_MAXLEN", 100_000, int),
      help="cap of the Redis output stream [env LOOKUPSPEC_REDIS_STREAM_MAXLEN]")
    a("--redis-buffer-limit", type=_non_negative, default=_env("REDIS_BUFFER_LIMIT", 10_000, int),
      help="appends held in memory while Redis is unreachable [env LOOKUPSPEC_REDIS_BUFFER_LIMIT]")
    keys = _env("API_KEYS", [], lambda s: [k.strip() for k in s.split(",") if k.strip()])
    a("--api-key", action="append", dest="api_keys", default=None, metavar="KEY:NAMESPACE",
      help="accept this key for this namespace (repeatable; none: no auth, one namespace) "
           "[env LOOKUPSPEC_API_KEYS, comma-separated]")
    parser.set_defaults(env_api_keys=keys)
    a("--max-queue", type=_non_negative, default=_env("MAX_QUEUE", 64, int),
      help="requests that may wait while one generates; more get 429 [env LOOKUPSPEC_MAX_QUEUE]")
    a("--request-timeout", type=_seconds, default=_env("REQUEST_TIMEOUT", 600.0, float),
      help="deadline of one generation request in seconds [env LOOKUPSPEC_REQUEST_TIMEOUT]")
    a("--drain-timeout", type=float, default=_env("DRAIN_TIMEOUT", 30.0, float),
      help="on SIGTERM, seconds in-flight requests may take [env LOOKUPSPEC_DRAIN_TIMEOUT]")
    a("--max-model-len", type=_positive, default=_env("MAX_MODEL_LEN", None, int),
      help="cap the context window below the model's [env LOOKUPSPEC_MAX_MODEL_LEN]")
    a("--output-cap-tokens", type=_positive, default=_env("OUTPUT_CAP_TOKENS", 1_000_000, int),
      help="tokens kept in each namespace's output lookup index [env LOOKUPSPEC_OUTPUT_CAP_TOKENS]")
    a("--max-body-bytes", type=_positive, default=_env("MAX_BODY_BYTES", 16 * 1024 * 1024, int),
      help="largest request body (413 above) [env LOOKUPSPEC_MAX_BODY_BYTES]")
    a("--max-documents", type=_positive, default=_env("MAX_DOCUMENTS", 1000, int),
      help="documents per upload (413 above) [env LOOKUPSPEC_MAX_DOCUMENTS]")
    a("--max-document-bytes", type=_positive, default=_env("MAX_DOCUMENT_BYTES", 2 * 1024 * 1024, int),
      help="bytes of one document's text (413 above) [env LOOKUPSPEC_MAX_DOCUMENT_BYTES]")
    a("--log-level", default=_env("LOG_LEVEL", "info"),
      choices=("critical", "error", "warning", "info", "debug"), help="[env LOOKUPSPEC_LOG_LEVEL]")


def _warm_up(text_engine: Any) -> None:
    """One short generation, so the first request does not pay for lazy initialisation."""
    params = text_engine.params(max_tokens=4, temperature=0.0)
    for _ in text_engine.engine.generate([0, 1, 2, 3], params):
        pass


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from lookupspec.gateway.app import build_service, create_app
    from lookupspec.gateway.config import GatewayConfig, Limits, parse_api_keys
    from lookupspec.gateway.store import StoreError, open_store
    from lookupspec.text import TextEngine

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        keys = parse_api_keys(args.api_keys if args.api_keys is not None else args.env_api_keys)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        # warmup: seeds the cost model that decides how much to draft (a few dummy forwards)
        te = TextEngine.load(args.model, draft_model=args.draft_model, dtype=args.dtype, device=args.device,
                             packed_linear=args.packed_linear, lean_forward=args.lean_forward, auto_pull=True,
                             warmup=True,
                             log=lambda m: print(m, file=sys.stderr))
    except ModelLoadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        config = GatewayConfig(
            model_name=args.served_model_name or te.loaded.name, api_keys=keys, max_queue=args.max_queue,
            request_timeout_s=args.request_timeout, drain_timeout_s=max(args.drain_timeout, 0.0),
            max_model_len=args.max_model_len, output_cap_tokens=args.output_cap_tokens,
            limits=Limits(max_body_bytes=args.max_body_bytes, max_documents_per_request=args.max_documents,
                          max_document_bytes=args.max_document_bytes))
        store = open_store(args.data_dir, args.redis_url, key_prefix=args.redis_prefix,
                           stream_maxlen=args.redis_stream_maxlen, buffer_limit=args.redis_buffer_limit,
                           start=False)
    except (ValueError, StoreError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        service = build_service(te, store, config)
        replayed = store.start()
    except (StoreError, OSError) as exc:
        store.close()
        print(f"error: cannot open the store: {exc}", file=sys.stderr)
        return 2
    backend = f"redis {args.redis_url}" if args.redis_url else f"embedded {args.data_dir}"
    print(f"store: {backend}, {replayed} records replayed", file=sys.stderr)
    _warm_up(te)
    app = create_app(service, close_store=True)
    server = _draining_server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                             timeout_graceful_shutdown=config.drain_timeout_s, lifespan="on"),
                              on_exit=service.begin_drain)
    # uvicorn re-raises the signal it stopped on once it has shut down, with the handler that was in
    # place before it started: a no-op here, so a drained SIGTERM ends with exit status 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    server.run()
    return 0


def _draining_server(config: Any, on_exit: Callable[[], None]) -> Any:
    """A ``uvicorn.Server`` that tells the service to refuse new requests as soon as a signal comes
    (uvicorn itself stops accepting connections, then waits for open ones up to the drain timeout)."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            on_exit()
            super().handle_exit(sig, frame)

    return DrainingServer(config)
