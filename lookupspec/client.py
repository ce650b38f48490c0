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
import json
import threading
import time
from collections.abc import AsyncIterator, Generator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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


class ClientError(RuntimeError):
    """A request the server (or the local engine) refused. ``status`` is the HTTP status (0: the
    server could not be reached), ``param`` the offending request parameter when known."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code


@dataclass(frozen=True)
class Lookup:
    """Where a request may draft from (the gateway's ``lookup`` object)."""

    enabled: bool = True
    collections: tuple[str, ...] = ()
    documents: tuple[str, ...] = ()  # inline texts to draft from for this request only
    max_draft_tokens: int | None = None
    sources: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"enabled": self.enabled}
        if self.collections:
            out["collections"] = list(self.collections)
        if self.documents:
            out["documents"] = list(self.documents)
        if self.max_draft_tokens is not None:
            out["max_draft_tokens"] = self.max_draft_tokens
        if self.sources is not None:
            out["sources"] = list(self.sources)
        return out


@dataclass(frozen=True)
class GenerationRequest:
    """One generation: a plain ``prompt`` (completions) or chat ``messages``. Greedy by default."""

    prompt: str | None = None
    messages: Sequence[Mapping[str, str]] | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    lookup: Lookup = field(default_factory=Lookup)

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ClientError("pass exactly one of prompt or messages", param="messages")

    def payload(self, model: str, *, stream: bool) -> dict[str, Any]:
        """The OpenAI-style request body."""
        body: dict[str, Any] = {
            "model": model, "max_tokens": self.max_tokens, "temperature": self.temperature,
            "top_p": self.top_p, "top_k": self.top_k, "stream": stream, "lookup": self.lookup.to_json(),
        }
        if self.seed is not None:
            body["seed"] = self.seed
        if self.stop:
            body["stop"] = list(self.stop)
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.messages is not None:
            body["messages"] = [dict(m) for m in self.messages]
        else:
            body["prompt"] = self.prompt
        return body


@dataclass(frozen=True)
class Delta:
    """Text released by one step. The last delta of a generation has ``finish_reason`` set and carries
    ``usage`` and ``speculation``."""

    text: str
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    speculation: dict[str, Any] | None = None


@dataclass
class Result:
    text: str
    finish_reason: str
    usage: dict[str, Any]  # OpenAI's: prompt/completion/total tokens, prompt_tokens_details.cached_tokens
    speculation: dict[str, Any]
    seconds: float  # request start to the last token
    first_token_s: float | None  # request start to the first non-empty text
    text_times: list[float] = field(default_factory=list, repr=False)  # request start to each text

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
                      dict(last.speculation or {}), time.perf_counter() - self.start, self.first, self.times)


# ---- in-process ---------------------------------------------------------------------------------


class LocalClient(Client):
    """An engine in this process, driven by a :class:`~lookupspec.scheduler.Scheduler` on its own
    thread: concurrent callers (threads, ``asyncio`` tasks) are batched into the same steps, up to
    ``max_batch`` sequences at once, exactly as the gateway batches its requests. Collections live in
    memory; the outputs of earlier requests feed the output drafter, as in the gateway. While the
    client runs requests, its engine must not be driven by anything else."""

    def __init__(self, engine: Any, *, model: str | None = None, output_cap_tokens: int = 1_000_000,
                 max_batch: int = 16) -> None:
        from lookupspec.index import OutputStore

        self.engine = engine  # lookupspec.text.TextEngine
        self._model = model or "local"
        self._max_batch = max_batch
        self._sched: Any = None
        self._closed = False
        self._lock = threading.Lock()
        self._collections: dict[str, Any] = {}
        self._output = OutputStore(output_cap_tokens)

    @property
    def model(self) -> str:
        return self._model

    @classmethod
    def load(cls, model: str, **kwargs: Any) -> LocalClient:
        """Load ``model`` (a path or a named default, see :func:`lookupspec.models.load_model`)."""
        from lookupspec.text import TextEngine

        return cls(TextEngine.load(model, **kwargs), model=model)

    def add_documents(self, collection: str, documents: Iterable[Mapping[str, Any]]) -> int:
        from lookupspec.index import CorpusStore

        docs = []
        for i, doc in enumerate(documents):
            if not isinstance(doc.get("id"), str) or not isinstance(doc.get("text"), str):
                raise ClientError("every document needs a string 'id' and 'text'", param=f"documents[{i}]")
            docs.append((doc["id"], doc["text"]))
        with self._lock:
            store = self._collections.setdefault(collection, CorpusStore())
            for doc_id, _ in docs:
                store.delete_document(doc_id)  # re-adding an id replaces it, as in the gateway
            store.add_documents(self.engine.corpus_documents(docs))
        return len(docs)

    def _plan(self, request: GenerationRequest) -> tuple[list[int], Any, Any, Any]:
        from lookupspec.models import ModelLoadError
        from lookupspec.planning import PlanError, UnknownCollection, plan_lookup

        te = self.engine
        lk = request.lookup
        try:
            params = te.params(max_tokens=request.max_tokens, temperature=request.temperature,
                               top_p=request.top_p, top_k=request.top_k, seed=request.seed)
        except ValueError as exc:
            raise ClientError(str(exc), param=_param_of(str(exc))) from exc

        def collection(name: str) -> Any:
            if name not in self._collections:
                raise UnknownCollection(name)
            return self._collections[name]

        try:
            plan = plan_lookup(te.engine.default_spec, enabled=lk.enabled, collections=lk.collections,
                               documents=lk.documents, max_draft_tokens=lk.max_draft_tokens,
                               sources=lk.sources, collection=collection,
                               inline_corpus=te.corpus_from_texts, output=self._output)
        except PlanError as exc:
            raise ClientError(exc.message, status=exc.status, param=exc.param, code=exc.code) from exc
        try:
            prompt_ids = te.encode_prompt(request.prompt, request.messages)
        except (ValueError, ModelLoadError) as exc:  # e.g. a tokenizer without a chat template
            param = "messages" if request.messages is not None else "prompt"
            raise ClientError(str(exc), param=param) from exc
        return prompt_ids, params, plan.spec, plan.scope

    def stream(self, request: GenerationRequest) -> Generator[Delta, None, None]:
        import numpy as np

        from lookupspec.stats import speculation_dict

        with self._lock:
            prompt_ids, params, spec, scope = self._plan(request)
        sink = _QueueSink(self.engine.follower(request.stop))
        param = "messages" if request.messages is not None else "prompt"
        try:
            req = self._scheduler().submit(prompt_ids, [(params, sink)], spec, scope, namespace="local")
        except ValueError as exc:
            raise ClientError(str(exc), param=param) from exc
        tokens: list[int] = []
        try:
            while True:
                item = sink.items.get()
                if isinstance(item, BaseException):
                    raise _local_failure(item) from item
                tokens.extend(item.token_ids)
                if item.finish_reason is None:
                    if item.text:
                        yield Delta(item.text)
                    continue
                if tokens:  # speculated or not: the output store serves later requests (planning)
                    with self._lock:
                        self._output.append(np.asarray(tokens, dtype=np.int32))
                cached = item.stats.cached_tokens if item.stats is not None else 0
                usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(tokens),
                         "total_tokens": len(prompt_ids) + len(tokens),
                         "prompt_tokens_details": {"cached_tokens": cached}}
                spec_stats = speculation_dict(item.stats) if item.stats is not None else {}
                yield Delta(item.text, item.finish_reason, usage, spec_stats)
                return
        finally:
            req.cancel()  # a no-op once finished; stops the generation when the consumer leaves early

    def _scheduler(self) -> Any:
        """The scheduler that runs this client's requests, batched (started on first use). A closed
        client starts none. `lookupspec summarize` closes its client on Ctrl-C while worker threads
        have requests in flight; those end with a 503, which the job retries after 0.5 s. A retry
        used to start a new scheduler thread, whose forwards then ran while the interpreter shut
        down. A thread that reaches for the GIL then is ended inside torch's C++ frames, and the
        process aborted ("terminate called without an active exception", status -6 instead of 130)."""
        with self._lock:
            if self._closed:
                raise ClientError("this client is closed", status=503, code="shutting_down")
            if self._sched is None:
                from lookupspec.scheduler import Scheduler

                self._sched = Scheduler(self.engine.engine, max_batch=self._max_batch)
                self._sched.start()
            return self._sched

    def close(self) -> None:
        """Stop the scheduler thread (requests still running end with an error); later requests
        fail with ClientError (status 503)."""
        with self._lock:
            self._closed = True
            sched, self._sched = self._sched, None
        if sched is not None:
            sched.stop()

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
                gen.close()  # cancels the scheduler request if it is still running

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


def _local_failure(error: BaseException) -> ClientError:
    """A generation that ended without finishing, as the gateway would report it."""
    from lookupspec.scheduler import Cancelled

    if isinstance(error, Cancelled) and error.reason == "shutdown":
        return ClientError("the client was closed while the request ran", status=503, code="shutting_down")
    return ClientError(f"the generation failed: {type(error).__name__}: {error}", status=500,
                       code="engine_error")


class _QueueSink:
    """A scheduler sink that turns one choice's steps into text chunks on a thread-safe queue."""

    def __init__(self, follow: Any) -> None:
        import queue

        self.follow = follow  # lookupspec.text.TextFollower
        self.items: queue.Queue[Any] = queue.Queue()

    def deliver(self, output: Any) -> bool:
        chunk = self.follow.feed(output)
        self.items.put(chunk)
        return chunk.finish_reason is None

    def fail(self, error: BaseException) -> None:
        self.items.put(error)


def _param_of(message: str) -> str | None:
    """The request parameter a local validation message names ("top_p must be ..." -> "top_p")."""
    name = message.split(" ", 1)[0]
    return name if name in {"max_tokens", "temperature", "top_k", "top_p", "seed"} else None


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
                parser = _SSE(chat=request.messages is not None)
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
                parser = _SSE(chat=request.messages is not None)
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
    """Parses the gateway's event stream (one choice) into deltas; the usage chunk closes it."""

    def __init__(self, *, chat: bool) -> None:
        self.chat = chat
        self.finish_reason: str | None = None
        self.speculation: dict[str, Any] | None = None
        self.done = False

    def feed(self, line: str) -> Iterator[Delta]:
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            raise _error_object(event["error"], 500)
        for choice in event.get("choices") or ():
            text = (choice.get("delta") or {}).get("content") if self.chat else choice.get("text")
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
                self.speculation = choice.get("speculation") or self.speculation
            if text:
                yield Delta(text)
        if event.get("usage") and not event.get("choices"):
            self.done = True
            yield Delta("", self.finish_reason or "length", event["usage"],
                        event.get("speculation") or self.speculation or {})

    def finish(self) -> Iterator[Delta]:
        if not self.done:  # a server without the usage chunk
            yield Delta("", self.finish_reason or "length", {}, self.speculation or {})


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
