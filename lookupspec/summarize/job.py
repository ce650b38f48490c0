"""The summarization job: documents in, one JSON line per finished document out.

A bounded pool of ``concurrency`` daemon threads keeps that many requests in flight, in process (a
:class:`~lookupspec.client.LocalClient`, whose scheduler batches them into the same steps) and over a
gateway alike; results are written by the main thread only, in finishing order. Each record::

    {"id": "a", "summary": "...", "finish_reason": "stop", "model": "...",
     "usage": {"prompt_tokens", "completion_tokens", "total_tokens"},
     "speculation": {"steps", "acceptance_length", ...},          # lookupspec.stats.SPECULATION_KEYS
     "timings": {"total_s", "first_token_s", "decode_s", "tokens_per_second", "decode_window"}}

``decode_s`` runs from the first text to the last token (``total_s - first_token_s``);
``decode_window`` is that span in seconds since the job started (documents in flight together
overlap). A document that
fails is reported and left out of the file, so a rerun tries it again.

The first ``plain_sample`` documents run one at a time, each decoded a second time right after with
speculation off (nothing written for it): the report measures the speedup over plain decoding against
that sample (:mod:`lookupspec.summarize.speedup`). The remaining documents follow, in the pool. Errors
that would fail every document (gateway unreachable, unknown model or collection, bad API key) stop
the job: :class:`FatalError`.
"""

from __future__ import annotations

import itertools
import json
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from lookupspec.client import Client, ClientError, GenerationRequest, Lookup, Result
from lookupspec.summarize.inputs import BadInput, Document
from lookupspec.summarize.interrupts import Interrupts
from lookupspec.summarize.outputs import OutputFile
from lookupspec.summarize.prompt import DEFAULT_TEMPLATE, PromptTemplate
from lookupspec.summarize.report import JobReport
from lookupspec.summarize.speedup import PlainSample

__all__ = ["FatalError", "JobConfig", "plain_sample", "plan", "run_job", "summarize_one"]

_FATAL_STATUS = (0, 401, 403, 404)  # unreachable, unauthorised, unknown model or collection
_RETRY_STATUS = (0, 429, 503)  # queue full, draining, connection refused: worth a few more tries


class FatalError(RuntimeError):
    """An error that would fail every document; the job stops."""


@dataclass(frozen=True)
class JobConfig:
    max_tokens: int = 256
    template: PromptTemplate = DEFAULT_TEMPLATE
    collection: str | None = None
    concurrency: int = 1
    strict: bool = False
    limit: int | None = None
    retries: int = 3
    plain_sample: int = 1  # documents decoded again without speculation, to measure the speedup
    progress: bool = False
    # a JSON schema the summary must follow (structured summaries): the record's "data" holds it parsed
    json_schema: dict[str, Any] | None = None
    log: Callable[[str], None] = field(default=lambda m: print(m, file=sys.stderr), compare=False)

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.concurrency < 1 or (self.limit is not None and self.limit < 0):
            raise ValueError("max_tokens and concurrency must be >= 1, limit >= 0")
        if self.plain_sample < 0:
            raise ValueError("plain_sample must be >= 0")


def plan(items: Iterable[Document | BadInput], done: set[str], config: JobConfig,
         report: JobReport) -> list[Document]:
    """The documents still to summarize, in input order; bad entries go to the report (and the log).
    With ``strict``, the first bad entry raises FatalError before any document is summarized."""
    pending: list[Document] = []
    for item in items:
        if isinstance(item, BadInput):
            if config.strict:
                raise FatalError(f"bad input (--strict): {item}")
            config.log(f"skipping bad input: {item}")
            report.bad_inputs.append(item)
        elif item.id in done:
            report.skipped_done += 1
        else:
            pending.append(item)
    return pending if config.limit is None else pending[:config.limit]


def _request(doc: Document, config: JobConfig, *, speculation: bool = True) -> GenerationRequest:
    lookup = Lookup(collections=(config.collection,) if config.collection else ()) if speculation \
        else Lookup(enabled=False)
    fmt = None if config.json_schema is None else {
        "type": "json_schema",
        "json_schema": {"name": "summary", "schema": config.json_schema, "strict": True}}
    # Greedy: a summary is reproducible, so a resumed job and a re-run give the same file.
    return GenerationRequest(messages=config.template.messages(doc.text), max_tokens=config.max_tokens,
                             temperature=0.0, lookup=lookup, response_format=fmt)


def _complete(client: Client, request: GenerationRequest, config: JobConfig) -> Result:
    """``client.complete``, retrying transient gateway errors."""
    for attempt in range(config.retries + 1):
        try:
            return client.complete(request)
        except ClientError as exc:
            if exc.status not in _RETRY_STATUS or attempt == config.retries:
                raise
            time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def summarize_one(client: Client, doc: Document, config: JobConfig,
                  clock: float | None = None) -> dict[str, Any]:
    """One document's record (see the module docstring); retries transient gateway errors. ``clock``:
    the job's start (``time.perf_counter()``), for the record's ``decode_window``."""
    sent = time.perf_counter()
    record = _record(doc, _complete(client, _request(doc, config), config), client.model,
                     config.json_schema is not None)
    t = record["timings"]
    if clock is not None and t["first_token_s"] is not None:
        start = sent - clock
        t["decode_window"] = [round(start + t["first_token_s"], 4), round(start + t["total_s"], 4)]
    return record


def plain_sample(client: Client, doc: Document, config: JobConfig) -> PlainSample | None:
    """Decode ``doc`` again with speculation off and time it; None when it produced no decode tokens.
    Greedy decoding gives the same tokens as the speculative run, so the times compare the same work."""
    result = _complete(client, _request(doc, config, speculation=False), config)
    times = result.text_times
    if result.first_token_s is None or len(times) < 2:
        return None
    return PlainSample(doc.id, max(int(result.usage.get("completion_tokens", 0)) - 1, 0),
                       max(result.seconds - result.first_token_s, 0.0),
                       tuple(b - a for a, b in itertools.pairwise(times)))


def _record(doc: Document, result: Result, model: str, structured: bool = False) -> dict[str, Any]:
    first = result.first_token_s
    extra: dict[str, Any] = {}
    if structured:  # a summary cut by max_tokens is unfinished JSON: "data" is null then
        try:
            extra["data"] = json.loads(result.text) if result.finish_reason == "stop" else None
        except ValueError:
            extra["data"] = None
    return {**extra,
        "id": doc.id, "summary": result.text.strip(), "finish_reason": result.finish_reason, "model": model,
        "usage": result.usage, "speculation": result.speculation,
        "timings": {"total_s": round(result.seconds, 4),
                    "first_token_s": None if first is None else round(first, 4),
                    "decode_s": None if first is None else round(max(result.seconds - first, 0.0), 4),
                    "tokens_per_second": round(result.tokens_per_second, 2)},
    }


def _is_fatal(exc: BaseException) -> bool:
    from lookupspec.models import ModelLoadError  # e.g. a tokenizer without a chat template

    return (isinstance(exc, ClientError) and exc.status in _FATAL_STATUS) or isinstance(exc, ModelLoadError)


def run_job(client: Client, docs: list[Document], out: OutputFile, config: JobConfig, report: JobReport,
            interrupts: Interrupts) -> None:
    """Summarize ``docs`` into ``out``. Raises FatalError, or JobInterrupted on SIGINT/SIGTERM; the
    output file is valid in every case."""
    from tqdm import tqdm

    with tqdm(total=len(docs), unit="doc", file=sys.stderr, disable=not config.progress,
              dynamic_ncols=True, desc="summarize") as bar:
        def finish(doc: Document, record: dict[str, Any] | None, error: BaseException | None) -> None:
            if error is not None:
                if _is_fatal(error):
                    raise FatalError(str(error)) from error
                report.failures.append((doc.id, f"{type(error).__name__}: {error}"))
                bar.write(f"failed: {doc.id}: {error}", file=sys.stderr)
            else:
                assert record is not None
                with interrupts.deferred():  # a signal waits until the line is on disk
                    out.append(record)
                    report.add(record)
            bar.update(1)
            bar.set_postfix(report.postfix(), refresh=False)

        def one(doc: Document) -> bool:
            """Summarize ``doc`` in this thread; whether it succeeded."""
            try:
                record = summarize_one(client, doc, config, report.started)
            except Exception as exc:  # one document's failure is reported, not the job's end
                finish(doc, None, exc)
                return False
            finish(doc, record, None)
            return True

        report.start()
        report.concurrency = config.concurrency
        sampled = docs[:config.plain_sample]
        for doc in sampled:
            if one(doc):
                try:
                    sample = plain_sample(client, doc, config)
                except Exception as exc:  # the summary is written; only the speedup figure lacks it
                    if _is_fatal(exc):
                        raise FatalError(str(exc)) from exc
                    bar.write(f"plain-decoding sample of {doc.id} failed: {exc}", file=sys.stderr)
                else:
                    if sample is not None:
                        report.plain_samples.append(sample)
        rest = docs[len(sampled):]
        if config.concurrency == 1:
            for doc in rest:
                one(doc)
        elif rest:
            _run_pool(client, rest, config, finish, report.started)


def _run_pool(client: Client, docs: list[Document], config: JobConfig,
              finish: Callable[[Document, dict[str, Any] | None, BaseException | None], None],
              clock: float) -> None:
    """``config.concurrency`` daemon threads take documents in order; the caller's thread writes.
    Daemon threads, so an interrupted job exits without waiting for requests in flight."""
    todo = iter(docs)
    take = threading.Lock()
    stop = threading.Event()
    results: queue.Queue[tuple[Document, dict[str, Any] | None, BaseException | None] | None] = queue.Queue()

    def worker() -> None:
        while not stop.is_set():
            with take:
                doc = next(todo, None)
            if doc is None:
                break
            try:
                results.put((doc, summarize_one(client, doc, config, clock), None))
            except Exception as exc:  # handed to the writer thread
                results.put((doc, None, exc))
        results.put(None)

    workers = min(config.concurrency, len(docs))
    for i in range(workers):
        threading.Thread(target=worker, name=f"summarize-{i}", daemon=True).start()
    running = workers
    try:
        while running:
            try:
                item = results.get(timeout=0.5)  # a timed wait lets signals through promptly
            except queue.Empty:
                continue
            if item is None:
                running -= 1
            else:
                finish(*item)
    finally:
        stop.set()
