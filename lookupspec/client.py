"""One client API over both ways to reach lookupspec: an engine in this process, or a gateway URL.

The integrations (LangChain wrapper, ``lookupspec summarize``, the RAG example) are written against
:class:`Client`, so each works in-process and over HTTP with the same code::

    client = connect("smollm2-135m-instruct")          # loads the model here
    client = connect("http://127.0.0.1:8000", api_key="sk-...")  # talks to `lookupspec serve`
    req = GenerationRequest(messages=[{"role": "user", "content": "Hi"}], max_tokens=64,
                            lookup=Lookup(collections=("docs",)))
    for delta in client.stream(req):
        print(delta.text, end="")
    result = client.complete(req)        # text, finish_reason, usage, speculation, timings

Both report speculation statistics in the gateway's ``speculation`` vocabulary
(:data:`lookupspec.stats.SPECULATION_KEYS`). Errors are :class:`ClientError` with the HTTP status
and the offending parameter, also for the in-process client (status 400/404 for bad input).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from lookupspec.requests import ClientError, GenerationRequest, Lookup
from lookupspec.sse import StreamState, parse_sse_line

__all__ = [
    "Client",
    "ClientError",
    "Delta",
    "GatewayClient",
    "GenerationRequest",
    "LocalClient",
    "Lookup",
    "Result",
    "connect",
]


@dataclass(frozen=True)
class Delta:
    """Text released by one step. The last delta of a generation has ``finish_reason`` set and carries
    ``usage`` and ``speculation``."""

    text: str
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    speculation: dict[str, Any] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # OpenAI's shape, on the last delta of a tool call


@dataclass
class Result:
    text: str
    finish_reason: str
    usage: dict[str, Any]  # OpenAI's: prompt/completion/total tokens, prompt_tokens_details.cached_tokens
    speculation: dict[str, Any]
    seconds: float  # request start to the last token
    first_token_s: float | None  # request start to the first non-empty text
    text_times: list[float] = field(default_factory=list, repr=False)  # request start to each text
    tool_calls: list[dict[str, Any]] | None = None  # OpenAI's shape ("tool_calls" finish reason)

    @property
    def tokens_per_second(self) -> float:
        n = self.usage.get("completion_tokens", 0)
        return n / self.seconds if self.seconds > 0 else 0.0


class Client:
    """Subclasses implement :attr:`model`, :meth:`stream`, :meth:`astream` and :meth:`add_documents`."""

    @property
    def model(self) -> str:
        """The model id requests name (the gateway's served model, or the local model spec)."""
        raise NotImplementedError

    def stream(self, request: GenerationRequest) -> Iterator[Delta]:
        raise NotImplementedError

    def astream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        raise NotImplementedError

    def add_documents(self, collection: str, documents: Iterable[Mapping[str, Any]]) -> int:
        """Index documents (``{"id", "text", "metadata"?}``) into a collection; returns how many."""
        raise NotImplementedError

    def complete(self, request: GenerationRequest) -> Result:
        collector = _Collector()
        for delta in self.stream(request):
            collector.add(delta)
        return collector.result()

    async def acomplete(self, request: GenerationRequest) -> Result:
        collector = _Collector()
        async for delta in self.astream(request):
            collector.add(delta)
        return collector.result()

    def close(self) -> None:
        """Release connections (the gateway client); a no-op in-process."""

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Collector:
    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.parts: list[str] = []
        self.first: float | None = None
        self.times: list[float] = []
        self.last: Delta | None = None

    def add(self, delta: Delta) -> None:
        if delta.text:
            self.times.append(time.perf_counter() - self.start)
            if self.first is None:
                self.first = self.times[0]
            self.parts.append(delta.text)
        if delta.finish_reason is not None:
            self.last = delta

    def result(self) -> Result:
        last = self.last or Delta("", "length")
        return Result("".join(self.parts), last.finish_reason or "length", dict(last.usage or {}),
                      dict(last.speculation or {}), time.perf_counter() - self.start, self.first, self.times,
                      last.tool_calls)


# ---- in-process ---------------------------------------------------------------------------------


class LocalClient(Client):
    """An engine in this process, run by the same ``Service`` as the gateway (``lookupspec.service``):
    one scheduler thread batches concurrent callers (threads, ``asyncio`` tasks) into the same steps,
    up to ``max_batch`` sequences at once; requests are planned, limited and accounted as over HTTP.
    Collections and the outputs of earlier requests live in memory (one namespace). While the client
    runs requests, its engine must not be driven by anything else."""

    def __init__(self, engine: Any, *, model: str | None = None, output_cap_tokens: int = 1_000_000,
                 max_batch: int = 16) -> None:
        from lookupspec.service import ServiceConfig

        self.engine = engine  # lookupspec.text.TextEngine
        self._model = model or "local"
        # Callers of one process wait for their turn rather than being refused (no queue bound), and a
        # request has no deadline of its own beyond what the caller imposes.
        self._config = ServiceConfig(model_name=self._model, max_batch=max_batch,
                                     output_cap_tokens=output_cap_tokens, max_queue=_UNBOUNDED,
                                     request_timeout_s=_NO_DEADLINE_S)
        self._service: Any = None
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    @property
    def model(self) -> str:
        return self._model

    @property
    def service(self) -> Any:
        """The ``lookupspec.service.Service`` this client runs (built on first use, with an in-memory
        store)."""
        with self._lock:
            if self._service is None:
                from lookupspec.service import build_service
                from lookupspec.store import memory_store

                self._service = build_service(self.engine, memory_store(), self._config)
            return self._service

    @classmethod
    def load(cls, model: str, **kwargs: Any) -> LocalClient:
        """Load ``model`` (a path or a named default, see :func:`lookupspec.models.load_model`)."""
        from lookupspec.text import TextEngine

        return cls(TextEngine.load(model, **kwargs), model=model)

    def add_documents(self, collection: str, documents: Iterable[Mapping[str, Any]]) -> int:
        from lookupspec.service.documents import Document, add_documents

        docs = []
        for i, doc in enumerate(documents):
            if not isinstance(doc.get("id"), str) or not isinstance(doc.get("text"), str):
                raise ClientError("every document needs a string 'id' and 'text'", param=f"documents[{i}]")
            docs.append(Document(doc["id"], doc["text"], dict(doc.get("metadata") or {})))
        with _as_client_error():
            records, _ = add_documents(self.service, _NAMESPACE, collection, docs)
        return len(records)

    def _running(self) -> Any:
        """The service, its scheduler started on first use. A closed client starts none: `lookupspec
        summarize` closes its client on Ctrl-C while worker threads have requests in flight, and a
        scheduler thread started then would run forwards while the interpreter shuts down (torch
        aborts the process)."""
        service = self.service
        with self._lock:
            if self._closed:
                raise ClientError("this client is closed", status=503, code="shutting_down")
            if not self._started:
                service.start()
                self._started = True
            return service

    def stream(self, request: GenerationRequest) -> Generator[Delta, None, None]:
        from lookupspec.service import ChoiceFinished, JobDone, JobFailed, JobRequest, TextDelta, plan
        from lookupspec.service.accounting import speculation, usage

        service = self._running()
        with _as_client_error():
            job = plan(service, JobRequest(
                prompt=request.prompt, messages=request.messages, max_tokens=request.max_tokens,
                temperature=request.temperature, top_p=request.top_p, top_k=request.top_k, seed=request.seed,
                stop=request.stop, lookup=request.lookup, response_format=request.response_format,
                tools=request.tools, tool_choice=request.tool_choice, logprobs=request.logprobs,
                frequency_penalty=request.frequency_penalty, presence_penalty=request.presence_penalty,
                repetition_penalty=request.repetition_penalty, logit_bias=request.logit_bias,
                min_tokens=request.min_tokens), _NAMESPACE)
            ticket = service.submit(job)
        finished: list[Any] = []
        held: list[str] = []  # a tool-call request's text, read as calls when it ends
        try:
            for event in ticket.events():
                if isinstance(event, TextDelta):
                    if job.tools is not None:
                        held.append(event.text)
                    elif event.text:
                        yield Delta(event.text)
                elif isinstance(event, ChoiceFinished):
                    finished.append(event)
                elif isinstance(event, JobFailed):
                    raise _client_error(event.error)
                elif isinstance(event, JobDone):
                    reason, calls, text = finished[0].finish_reason, None, ""
                    if job.tools is not None:
                        from lookupspec.service.tools import parse_calls

                        content, found = parse_calls("".join(held), job.tools)
                        text, calls = content or "", found or None
                        reason = "tool_calls" if calls else reason
                    yield Delta(text, reason, usage(job.prompt_tokens, finished),
                                speculation([f.stats for f in finished]), calls)
        finally:
            ticket.cancel("disconnect")  # a no-op once finished; stops the generation when the caller leaves

    def close(self) -> None:
        """Stop the scheduler thread (requests still running end with a 503); later requests fail
        with ClientError (status 503)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            service = self._service
        if service is not None:
            service.close()

    async def astream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        """Runs :meth:`stream` on a worker thread; leaving the loop early stops the generation."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Delta | BaseException | None] = asyncio.Queue()  # a step's text: small
        cancelled = threading.Event()

        def put(item: Delta | BaseException | None) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the consumer's loop is gone
                cancelled.set()

        def work() -> None:
            gen = self.stream(request)
            try:
                for delta in gen:
                    if cancelled.is_set():
                        break
                    put(delta)
                put(None)
            except BaseException as exc:  # handed to the consumer
                put(exc)
            finally:
                gen.close()  # cancels the request if it is still running

        thread = threading.Thread(target=work, name="lookupspec-local", daemon=True)
        thread.start()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancelled.set()


_NAMESPACE = "local"
_UNBOUNDED = 2**31 - 1
_NO_DEADLINE_S = 365 * 24 * 3600.0


def _client_error(error: Any) -> ClientError:
    """A ``lookupspec.service.ServiceError`` as the gateway client would raise it."""
    return ClientError(error.message, status=error.status, param=error.param, code=error.code)


@contextlib.contextmanager
def _as_client_error() -> Iterator[None]:
    from lookupspec.service import ServiceError

    try:
        yield
    except ServiceError as exc:
        raise _client_error(exc) from None


# ---- over HTTP ----------------------------------------------------------------------------------


class GatewayClient(Client):
    """A ``lookupspec serve`` gateway (or any server speaking its API). ``model`` defaults to the
    first model ``GET /v1/models`` lists."""

    def __init__(self, base_url: str, *, api_key: str | None = None, model: str | None = None,
                 timeout: float = 600.0) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._headers = headers
        self._timeout = timeout
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
        self._model = model

    @property
    def model(self) -> str:
        if self._model is None:
            data = self._request("GET", "/v1/models")
            models = data.get("data") or []
            if not models:
                raise ClientError("the gateway serves no model", status=503)
            self._model = str(models[0]["id"])
        return self._model

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        import httpx

        try:
            resp = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise ClientError(f"cannot reach the gateway at {self.base_url}: {exc}", status=0) from exc
        if resp.status_code >= 400:
            raise _http_error(resp.status_code, resp.text)
        return resp.json()

    def add_documents(self, collection: str, documents: Iterable[Mapping[str, Any]]) -> int:
        docs = [dict(d) for d in documents]
        if not docs:
            return 0
        total = 0
        for start in range(0, len(docs), 64):  # bounded request bodies
            data = self._request("POST", f"/v1/collections/{collection}/documents",
                                 {"documents": docs[start:start + 64]})
            total += len(data.get("documents", []))
        return total

    def _path(self, request: GenerationRequest) -> str:
        return "/v1/chat/completions" if request.messages is not None else "/v1/completions"

    def stream(self, request: GenerationRequest) -> Iterator[Delta]:
        import httpx

        body = request.payload(self.model, stream=True)
        try:
            with self._http.stream("POST", self._path(request), json=body) as resp:
                if resp.status_code >= 400:
                    raise _http_error(resp.status_code, resp.read().decode(errors="replace"))
                parser = _SSE()
                for line in resp.iter_lines():
                    yield from parser.feed(line)
                yield from parser.finish()
        except httpx.HTTPError as exc:
            raise ClientError(f"gateway stream failed: {exc}", status=0) from exc

    async def astream(self, request: GenerationRequest) -> AsyncIterator[Delta]:
        import httpx

        model = self._model if self._model is not None else await asyncio.to_thread(lambda: self.model)
        body = request.payload(model, stream=True)
        try:
            async with httpx.AsyncClient(base_url=self.base_url, headers=self._headers,
                                         timeout=self._timeout) as http, \
                    http.stream("POST", self._path(request), json=body) as resp:
                if resp.status_code >= 400:
                    raise _http_error(resp.status_code, (await resp.aread()).decode(errors="replace"))
                parser = _SSE()
                async for line in resp.aiter_lines():
                    for delta in parser.feed(line):
                        yield delta
                for delta in parser.finish():
                    yield delta
        except httpx.HTTPError as exc:
            raise ClientError(f"gateway stream failed: {exc}", status=0) from exc


def _http_error(status: int, text: str) -> ClientError:
    try:
        return _error_object(json.loads(text)["error"], status)
    except (ValueError, KeyError, TypeError, AttributeError):
        return ClientError(f"HTTP {status}: {text[:500]}", status=status)


def _error_object(err: Mapping[str, Any], status: int) -> ClientError:
    """An OpenAI-style ``{"message", "param", "code"}`` error object as a ClientError."""
    return ClientError(str(err.get("message")), status=status, param=err.get("param"), code=err.get("code"))


class _SSE:
    """The gateway's event stream (one choice) as deltas; the usage chunk closes it."""

    def __init__(self) -> None:
        self.state = StreamState()

    def feed(self, line: str) -> Iterator[Delta]:
        event = parse_sse_line(line)
        if not isinstance(event, dict):
            return
        text = self.state.feed(event)
        if self.state.error is not None:
            raise _error_object(self.state.error, 500)
        if text:
            yield Delta(text)
        if self.state.usage_seen:
            yield self._last(self.state.usage or {})

    def finish(self) -> Iterator[Delta]:
        if not self.state.usage_seen:  # a server without the usage chunk
            yield self._last({})

    def _last(self, usage: dict[str, Any]) -> Delta:
        return Delta("", self.state.finish_reason or "length", usage, self.state.speculation or {},
                     self.state.tool_calls or None)


def connect(target: Any, *, api_key: str | None = None, model: str | None = None, **kwargs: Any) -> Client:
    """A client for ``target``: an ``http(s)://`` gateway URL, a loaded ``TextEngine``, or a model
    spec to load in this process (``kwargs`` go to :meth:`TextEngine.load`)."""
    if isinstance(target, Client):
        return target
    if isinstance(target, str) and target.startswith(("http://", "https://")):
        return GatewayClient(target, api_key=api_key, model=model, **kwargs)
    if isinstance(target, str):
        return LocalClient.load(target, **kwargs)
    return LocalClient(target, model=model)
