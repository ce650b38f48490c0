"""Start the HTTP gateway: OpenAI-compatible completions and chat, the documents API, /health, /ready
and /metrics. Every flag can also be set from the environment variable named in its help.

The shared store is embedded (an append-only log under --data-dir) unless --redis-url is given; then
every replica on that Redis shares documents and output caches (and --data-dir holds only what a stop
during a Redis outage could not write).

Lifecycle (``lookupspec.gateway.lifecycle``): the socket is bound first and the model is loaded on a
background thread; meanwhile /health answers "loading" and /v1 requests get 503. SIGTERM starts a
drain: the listener stays open (/ready says "draining", new requests get 503 shutting_down),
in-flight requests finish for up to --drain-timeout seconds, streams still running then end with an
error event and [DONE]; then the server closes and exits with status 0. A second signal exits at
once. A model or store that cannot be opened exits with status 2."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lookupspec.commands.common import (
    add_model_arguments,
    engine_config,
    model_config,
    non_negative_int,
    positive_float,
    positive_int,
)
from lookupspec.models import ModelLoadError

_ENV = "LOOKUPSPEC_"


def _env(name: str, default: Any, convert: Callable[[str], Any] = str) -> Any:
    raw = os.environ.get(_ENV + name)
    if raw is None or raw == "":
        return default
    try:
        return convert(raw)
    except (ValueError, argparse.ArgumentTypeError):
        raise SystemExit(f"error: environment variable {_ENV + name}={raw!r} is not valid") from None


def _stretch(text: str) -> float:
    value = float(text)
    if not (value == 0 or value > 1):
        raise argparse.ArgumentTypeError(f"must be 0 (off) or > 1, got {value}")
    return value


def _writable_file(text: str) -> str:
    """A file this process can append to (its directory created); checked before anything loads."""
    path = Path(text).expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot append to {text!r}: {exc.strerror or exc}") from None
    return str(path)


def _stretched(te: Any, stretch: float) -> str:
    """How prompt chunks follow the load, for the start-up line."""
    if not stretch:
        return ""
    if not te.engine.free_chunks:
        return " (whole: the forward is not chunk-invariant)"
    return f" (fewer while sequences decode: forwards up to ~{stretch:g}x a plain step)"


def configure(parser: argparse.ArgumentParser) -> None:
    groups = {name: parser.add_argument_group(title) for name, title in (
        ("model", "model"), ("batching", "batching and memory"), ("speculation", "speculation"),
        ("storage", "storage (documents and outputs)"), ("http", "HTTP and operations"))}
    add_model_arguments(groups["model"])
    home = Path(os.environ.get("LOOKUPSPEC_HOME", Path.home() / ".cache" / "lookupspec")).expanduser()
    a = groups["model"].add_argument
    a("--draft-model", default=_env("DRAFT_MODEL", None),
      help="draft model (same tokenizer) or self:layers=K / self:int8 [env LOOKUPSPEC_DRAFT_MODEL]")
    a("--served-model-name", default=_env("SERVED_MODEL_NAME", None),
      help="the id clients send as `model`; unset: the model's name [env LOOKUPSPEC_SERVED_MODEL_NAME]")
    a("--max-model-len", type=positive_int, default=_env("MAX_MODEL_LEN", None, int),
      help="cap the context window below the model's [env LOOKUPSPEC_MAX_MODEL_LEN]")
    a = groups["batching"].add_argument
    a("--max-queue", type=non_negative_int, default=_env("MAX_QUEUE", 64, int),
      help="requests that may wait for a slot while --max-batch sequences run; more get 429 "
           "[env LOOKUPSPEC_MAX_QUEUE]")
    a("--max-batch", type=positive_int, default=_env("MAX_BATCH", 16, int),
      help="sequences generating at once, batched into one forward per step (a request with n choices "
           "takes n) [env LOOKUPSPEC_MAX_BATCH]")
    a("--max-batch-tokens", type=positive_int, default=_env("MAX_BATCH_TOKENS", None, int),
      help="rows one forward may have, prompt chunks included (unset: the draft budget alone decides) "
           "[env LOOKUPSPEC_MAX_BATCH_TOKENS]")
    a("--prefill-chunk", type=positive_int, default=_env("PREFILL_CHUNK", 128, int),
      help="prompt tokens prefilled per scheduler iteration, in the same forward as the running streams' "
           "decode step, so they keep stepping while a long prompt is prefilled; smaller chunks shorten the "
           "longest inter-token gaps and slow prefill [env LOOKUPSPEC_PREFILL_CHUNK]")
    a("--prefill-stretch", type=_stretch, default=_env("PREFILL_STRETCH", 2.5, _stretch),
      help="while sequences decode, size each forward's prompt chunk so that the forward takes about this "
           "many times a plain decode step of every sequence holding a slot (measured; at least 16 tokens, "
           "at most --prefill-chunk, or two chunks when the prefill falls behind the decode): lower keeps "
           "the streams' inter-token gaps even and slows prefill, higher the opposite; 0 always prefills "
           "whole chunks. Needs a chunk-invariant forward (the native CPU attention); elsewhere chunks stay "
           "whole [env LOOKUPSPEC_PREFILL_STRETCH]")
    a("--prefix-cache-mb", type=non_negative_int, default=_env("PREFIX_CACHE_MB", 512, int),
      help="memory for the prefix cache: the KV of recent prompts' whole blocks, reused by prompts "
           "of the same namespace that start alike (a shared system prompt, the same retrieved passages); "
           "least recently used first out; 0 turns it off [env LOOKUPSPEC_PREFIX_CACHE_MB]")
    a("--no-prefix-cache", dest="prefix_cache_mb", action="store_const", const=0,
      help="turn the prefix cache off (same as --prefix-cache-mb 0)")
    a("--prefix-block-size", type=positive_int, default=_env("PREFIX_BLOCK_SIZE", None, int),
      help="tokens per prefix-cache block: prompts share whole blocks, so smaller blocks share shorter "
           "heads (a system prompt, an instruction header) for more index entries. At most "
           "--prefill-chunk; smaller than it only with a chunk-invariant forward (the native CPU "
           "attention), elsewhere a block is a prefill chunk (unset: 32 where that allows, else the "
           "chunk) [env LOOKUPSPEC_PREFIX_BLOCK_SIZE]")
    a("--kv-cache-mb", type=positive_int, default=_env("KV_CACHE_MB", None, int),
      help="memory for the KV cache, reserved at start and split evenly between the --max-batch slots, "
           "so that no step waits for the cache to grow under load; a request that outgrows its share "
           "ends with finish_reason length, a prompt that does not fit one gets a 400; sliding-window "
           "layers take only their window and one forward's rows, leaving the rest to full-attention "
           "layers (unset: grow as needed, which stalls every stream for a moment each time the cache "
           "doubles) [env LOOKUPSPEC_KV_CACHE_MB]")
    a = groups["speculation"].add_argument
    a("--output-cap-tokens", type=positive_int, default=_env("OUTPUT_CAP_TOKENS", 1_000_000, int),
      help="tokens kept in each namespace's output lookup index [env LOOKUPSPEC_OUTPUT_CAP_TOKENS]")
    a = groups["storage"].add_argument
    a("--data-dir", type=Path, default=_env("DATA_DIR", home / "data", Path),
      help="embedded store directory (unused with --redis-url) [env LOOKUPSPEC_DATA_DIR]")
    a("--redis-url", default=_env("REDIS_URL", None),
      help="share the store through Redis (redis://host:port/db) [env LOOKUPSPEC_REDIS_URL]")
    a("--redis-prefix", default=_env("REDIS_PREFIX", "lookupspec:"),
      help="key prefix of the Redis streams [env LOOKUPSPEC_REDIS_PREFIX]")
    a("--redis-stream-maxlen", type=positive_int, default=_env("REDIS_STREAM_MAXLEN", 100_000, int),
      help="cap of the Redis output stream [env LOOKUPSPEC_REDIS_STREAM_MAXLEN]")
    a("--redis-buffer-limit", type=non_negative_int, default=_env("REDIS_BUFFER_LIMIT", 10_000, int),
      help="document writes held in memory while Redis is unreachable [env LOOKUPSPEC_REDIS_BUFFER_LIMIT]")
    a("--redis-output-buffer-limit", type=non_negative_int,
      default=_env("REDIS_OUTPUT_BUFFER_LIMIT", 1_000, int),
      help="outputs held in memory while Redis is unreachable, apart from documents (more are dropped: "
           "the output cache is a cache) [env LOOKUPSPEC_REDIS_OUTPUT_BUFFER_LIMIT]")
    a = groups["http"].add_argument
    a("--host", default=_env("HOST", "127.0.0.1"), help="interface to bind [env LOOKUPSPEC_HOST]")
    a("--port", type=int, default=_env("PORT", 8000, int), help="TCP port [env LOOKUPSPEC_PORT]")
    keys = _env("API_KEYS", [], lambda s: [k.strip() for k in s.split(",") if k.strip()])
    a("--api-key", action="append", dest="api_keys", default=None, metavar="KEY:NAMESPACE",
      help="accept this key for this namespace (repeatable; none: no auth, one namespace) "
           "[env LOOKUPSPEC_API_KEYS, comma-separated]")
    parser.set_defaults(env_api_keys=keys)
    a("--admin-key", default=_env("ADMIN_KEY", None),
      help="the key that may see /health's detail and digest (unset: any valid API key; without API "
           "keys, set it to protect just that detail) [env LOOKUPSPEC_ADMIN_KEY]")
    # the environment's value stays a string: argparse checks (and creates) it only when the flag is absent
    a("--trace-iterations", type=_writable_file, default=_env("TRACE_ITERATIONS", None),
      metavar="FILE",
      help="append one JSON line per scheduler iteration to FILE: the forward's time and the decode "
           "step's share, sequences, rows and draft nodes, the prompt tokens it prefilled and the chunk "
           "budget, requests waiting; for finding what a long inter-token gap or a slow first token "
           "waited on (a few microseconds an iteration) [env LOOKUPSPEC_TRACE_ITERATIONS]")
    a("--request-timeout", type=positive_float, default=_env("REQUEST_TIMEOUT", 600.0, float),
      help="deadline of one generation request in seconds [env LOOKUPSPEC_REQUEST_TIMEOUT]")
    a("--drain-timeout", type=float, default=_env("DRAIN_TIMEOUT", 30.0, float),
      help="on SIGTERM, seconds in-flight requests may take [env LOOKUPSPEC_DRAIN_TIMEOUT]")
    a("--max-body-bytes", type=positive_int, default=_env("MAX_BODY_BYTES", 16 * 1024 * 1024, int),
      help="largest request body (413 above) [env LOOKUPSPEC_MAX_BODY_BYTES]")
    a("--max-header-bytes", type=positive_int, default=_env("MAX_HEADER_BYTES", 32 * 1024, int),
      help="largest request line plus headers, read before anything else (431 above) "
           "[env LOOKUPSPEC_MAX_HEADER_BYTES]")
    a("--body-timeout", type=positive_float, default=_env("BODY_TIMEOUT", 30.0, float),
      help="seconds a request body may send nothing before it gets 408 [env LOOKUPSPEC_BODY_TIMEOUT]")
    a("--max-documents", type=positive_int, default=_env("MAX_DOCUMENTS", 1000, int),
      help="documents per upload (413 above) [env LOOKUPSPEC_MAX_DOCUMENTS]")
    a("--max-document-bytes", type=positive_int, default=_env("MAX_DOCUMENT_BYTES", 2 * 1024 * 1024, int),
      help="bytes of one document's text (413 above) [env LOOKUPSPEC_MAX_DOCUMENT_BYTES]")
    a("--log-level", default=_env("LOG_LEVEL", "info"),
      choices=("critical", "error", "warning", "info", "debug"), help="[env LOOKUPSPEC_LOG_LEVEL]")

_GRACE_S = 5  # after a drain, how long the last answers (and uvicorn's connections) may take


def _packed(text_engine: Any) -> str:
    """How the model's linear layers run: "on (stream)", "on (onednn)", or "off" when none is packed."""
    backends = sorted({getattr(m, "backend", "") for m in text_engine.loaded.model.modules()
                       if type(m).__name__ == "PackedLinear"})
    return f"on ({', '.join(backends)})" if backends else "off"


def _attention(text_engine: Any) -> str:
    """Which attention the served model's forwards use: "native" (CPU float32, the kernel built) or
    "sdpa"."""
    import torch

    from lookupspec.runtime.native import attention as native_attention

    param = next(text_engine.loaded.model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.float32:
        return "sdpa"
    return "native" if native_attention.kernel() is not None else "sdpa"


def _lean(text_engine: Any) -> str:
    """Whether the served model's forwards take the lean path, and with which element-wise steps:
    "on (native element-wise steps)", "on (torch ops)" or "off"."""
    if text_engine.engine.runner.lean is None:
        return "off"
    from lookupspec.runtime.native import layer_ops

    return "on (native element-wise steps)" if layer_ops.kernel() is not None else "on (torch ops)"


def _graphs(text_engine: Any) -> str:
    """Whether the served model's forwards go through the static step (``--cuda-graphs``): "on" (CUDA
    graphs), "on, eagerly (no CUDA device)" or "off"."""
    static = text_engine.engine.runner.static
    if static is None:
        return "off"
    return "on" if static.graphs is not None else "on, eagerly (no CUDA device)"


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything heavy is imported or loaded: from here on clients
    are queued by the kernel instead of refused, and answered (/health: "loading") as soon as the
    server loop runs (after the imports, a few seconds), long before the model is ready."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def run(args: argparse.Namespace) -> int:
    from lookupspec.gateway.config import Limits, parse_api_keys

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        keys = parse_api_keys(args.api_keys if args.api_keys is not None else args.env_api_keys)
        limits = Limits(max_body_bytes=args.max_body_bytes, max_documents_per_request=args.max_documents,
                        max_document_bytes=args.max_document_bytes, body_timeout_s=args.body_timeout)
        if args.admin_key is not None and (not args.admin_key or args.admin_key in keys):
            raise ValueError("--admin-key must be non-empty and differ from every API key")
        if args.prefix_block_size is not None and args.prefix_block_size > args.prefill_chunk:
            raise ValueError(f"--prefix-block-size ({args.prefix_block_size}) must be at most "
                             f"--prefill-chunk ({args.prefill_chunk})")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    host, port = sock.getsockname()[:2]
    _say(f"listening on http://{f'[{host}]' if ':' in host else host}:{port} "
         "(/health answers 'loading' until the model is ready)")
    try:
        return _serve(args, sock, keys, limits)
    finally:
        sock.close()


def _serve(args: argparse.Namespace, sock: socket.socket, keys: dict[str, str], limits: Any) -> int:
    import uvicorn

    from lookupspec.gateway.app import build_app
    from lookupspec.gateway.auth import Authenticator
    from lookupspec.gateway.lifecycle import Lifecycle
    from lookupspec.store import StoreError, open_store

    try:
        # Opened (not started: no replay yet) before serving, so a locked data directory or a bad
        # Redis URL is an error at once.
        store = open_store(args.data_dir, args.redis_url, key_prefix=args.redis_prefix,
                           stream_maxlen=args.redis_stream_maxlen, buffer_limit=args.redis_buffer_limit,
                           output_buffer_limit=args.redis_output_buffer_limit, start=False)
    except (ValueError, StoreError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    lifecycle = Lifecycle()
    drain_timeout = max(args.drain_timeout, 0.0)
    app = build_app(lifecycle, auth=Authenticator(keys, admin_key=args.admin_key),
                    max_body_bytes=limits.max_body_bytes, drain_timeout_s=drain_timeout,
                    body_timeout_s=limits.body_timeout_s, store=store)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, lifespan="on",
                            timeout_graceful_shutdown=_GRACE_S, http=_http_protocol(args.max_header_bytes),
                            h11_max_incomplete_event_size=args.max_header_bytes)
    server = _gateway_server(config, lifecycle, drain_timeout,
                             load=lambda: _load(args, keys, limits, store, lifecycle))
    # uvicorn re-raises the signal it stopped on once it has shut down, with the handler that was in
    # place before it started: a no-op here, so a drained SIGTERM or Ctrl-C ends with exit status 0
    # (and `make serve` does not report "Error 130").
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    server.run(sockets=[sock])
    return lifecycle.exit_code


def _load(args: argparse.Namespace, keys: dict[str, str], limits: Any, store: Any, lifecycle: Any) -> bool:
    """Build the service (model, store replay, warm-up) and hand it to ``lifecycle``. Runs on the
    loader thread while the server already answers. False when it failed (reported, exit status 2)."""
    import torch

    from lookupspec.gateway.app import build_service
    from lookupspec.gateway.config import GatewayConfig
    from lookupspec.store import StoreError
    from lookupspec.text import TextEngine
    from lookupspec.warmup import warm_text

    started = time.perf_counter()
    _say(f"loading {args.model} (a first load converts the model and compiles kernels: a minute or more) ...")
    try:
        # warmup: seeds the cost model that decides how much to draft (a few dummy forwards)
        kv_bytes = None if args.kv_cache_mb is None else args.kv_cache_mb * 2**20
        engine = engine_config(args, max_batch=args.max_batch, kv_cache_bytes=kv_bytes,
                               prefill_chunk=args.prefill_chunk,
                               prefix_cache_bytes=args.prefix_cache_mb * 2**20,
                               prefix_block_size=args.prefix_block_size)
        te = TextEngine.load(args.model, model_config(args), engine, warmup=True, log=_say)
        config = GatewayConfig(
            model_name=args.served_model_name or te.loaded.name, api_keys=keys, admin_key=args.admin_key,
            max_queue=args.max_queue, max_batch=args.max_batch, max_batch_tokens=args.max_batch_tokens,
            prefill_stretch=args.prefill_stretch, request_timeout_s=args.request_timeout,
            drain_timeout_s=max(args.drain_timeout, 0.0), max_model_len=args.max_model_len,
            output_cap_tokens=args.output_cap_tokens, limits=limits, trace_iterations=args.trace_iterations)
        service = build_service(te, store, config)
        spec = te.engine.default_spec
        _say(f"weights: {te.loaded.weights}, {te.loaded.resident_bytes() / 2**20:.0f} MiB resident")
        _say(f"model: {config.model_name} ({te.loaded.path}), {te.loaded.dtype} on {args.device}, "
             f"{torch.get_num_threads()} threads, context window {service.context_window} tokens; "
             f"speculation {'on' if spec.enabled else 'off'}: up to {spec.max_draft_tokens} draft tokens "
             f"per step, sources {','.join(spec.sources)}, draft model {args.draft_model or 'none'}; "
             f"packed linear {_packed(te) if args.packed_linear else 'off'}, attention {_attention(te)}, "
             f"lean forward {_lean(te)}, CUDA graphs {_graphs(te)}; batches of up to {args.max_batch} "
             f"sequences, prefill chunks of {args.prefill_chunk} tokens"
             f"{_stretched(te, args.prefill_stretch)}, prefix cache "
             + (f"{args.prefix_cache_mb} MiB in blocks of {te.engine.prefix_block_size} tokens"
                if args.prefix_cache_mb else "off"))
        pool = te.engine.runner.pool
        sliding = "".join(f"; sliding-window layers (window {g.window}) {pool.reserved_entries(g)} "
                          "entries a slot" for g in pool.groups if g.window is not None)
        scratch = "" if te.engine.runner.static is None else " (one of them the static step's scratch slot)"
        _say(f"KV cache: {pool.nbytes / 2**20:.0f} MiB reserved, {pool.max_batch} slots{scratch} of "
             f"{pool.slot_positions} positions{sliding}" if args.kv_cache_mb is not None else
             "KV cache: grows as needed (--kv-cache-mb reserves it at start)")
        replayed = store.start()
        backend = f"redis {args.redis_url}" if args.redis_url else f"embedded {args.data_dir}"
        synced = store.health().get("synced", True)
        _say(f"store: {backend}, {replayed} records replayed"
             + ("" if synced else " (redis unreachable: /ready answers 'syncing' until it is read)"))
        warm_text(te)  # what the first request would otherwise pay for
    except (ModelLoadError, StoreError, OSError, ValueError) as exc:
        _say(f"error: {exc}")
        lifecycle.fail(str(exc), exit_code=2)
        return False
    except Exception as exc:  # a bug: report it and exit rather than serve 'loading' forever
        logging.getLogger(__name__).exception("start-up failed")
        lifecycle.fail(f"{type(exc).__name__}: {exc}", exit_code=1)
        return False
    if not lifecycle.set_ready(service):  # stopped while loading
        service.close(timeout=1.0)
        return False
    _say(f"ready: serving {config.model_name} ({time.perf_counter() - started:.1f} s to load); "
         "Ctrl-C or SIGTERM stops it")
    return True


def _http_protocol(max_head_bytes: int) -> Any:
    """uvicorn's HTTP protocol class, answering a request it cannot parse (a malformed
    Content-Length, a bad request line) with an OpenAI-shaped 400 instead of plain text, and a request
    whose line and headers exceed ``max_head_bytes`` with an OpenAI-shaped 431 as soon as that many
    bytes arrived without the end of the head (httptools sets no bound of its own: it would buffer a
    header of any size, before authentication)."""
    from lookupspec.gateway.errors import error_body

    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
        counting = True
    except ImportError:  # uvicorn without httptools: h11 bounds the head itself (a 400 below)
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base  # type: ignore[assignment]
        counting = False

    bad = json.dumps(error_body("invalid HTTP request: malformed request line or headers "
                                "(e.g. Content-Length)", "invalid_request_error", None,
                                "invalid_http_request")).encode()
    large = json.dumps(error_body(f"the request line and headers exceed the limit of {max_head_bytes} "
                                  "bytes", "invalid_request_error", None,
                                  "request_header_fields_too_large")).encode()

    class Protocol(Base):
        # Bytes of the current request's head received so far; None once its headers are complete
        # (and always None under h11, which bounds the head itself).
        _head_bytes: int | None = 0 if counting else None

        def _send_error(self, status: bytes, body: bytes) -> None:
            head = [b"HTTP/1.1 " + status + b"\r\n"]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            head += [b"content-type: application/json\r\n",
                     b"content-length: " + str(len(body)).encode() + b"\r\n",
                     b"connection: close\r\n\r\n"]
            self.transport.write(b"".join(head) + body)
            self.transport.close()

        def send_400_response(self, msg: str) -> None:
            self._send_error(b"400 Bad Request", bad)

        def data_received(self, data: bytes) -> None:
            if self._head_bytes is not None:
                self._head_bytes += len(data)
            super().data_received(data)
            # After the parser ran, so a chunk that completes the head (and carries body bytes) passes.
            if (self._head_bytes is not None and self._head_bytes > max_head_bytes
                    and not self.transport.is_closing()):
                self.logger.warning("request head over %d bytes: 431", max_head_bytes)
                self._send_error(b"431 Request Header Fields Too Large", large)

        def on_headers_complete(self) -> None:
            self._head_bytes = None
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head_bytes = 0  # the next request on this connection starts its head

    return Protocol


def _gateway_server(config: Any, lifecycle: Any, drain_timeout: float, load: Callable[[], bool]) -> Any:
    """A ``uvicorn.Server`` with the replica's lifecycle: the loader starts once the server runs, and
    the first SIGTERM/SIGINT drains (``Lifecycle.drain``, listener open) before uvicorn shuts down;
    a signal while loading, or a second one, exits at once. (A factory, as uvicorn is imported only
    when serving.)"""
    import uvicorn

    class GatewayServer(uvicorn.Server):
        def __init__(self) -> None:
            super().__init__(config)
            self._loop: asyncio.AbstractEventLoop | None = None
            self._drain_task: asyncio.Task[None] | None = None

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.should_exit or not self.servers:
                return
            self._loop = asyncio.get_running_loop()
            threading.Thread(target=self._load, name="model-loader", daemon=True).start()

        def _load(self) -> None:
            if not load():
                self.should_exit = True  # nothing to serve: shut down (exit status from lifecycle)

        def handle_exit(self, sig: int, frame: Any) -> None:
            # Runs in the signal handler: only schedule the drain on the loop.
            if self._drain_task is None and self._loop is not None and lifecycle.begin_drain():
                _say(f"signal {sig}: draining (up to {drain_timeout:g} s for requests in flight)")
                self._loop.call_soon_threadsafe(self._start_drain, sig)
                return
            super().handle_exit(sig, frame)

        def _start_drain(self, sig: int) -> None:
            self._drain_task = asyncio.ensure_future(self._drain(sig))

        async def _drain(self, sig: int) -> None:
            await lifecycle.drain(drain_timeout, grace=_GRACE_S)
            super().handle_exit(sig, None)

    return GatewayServer()
