"""The service's timing-dependent behaviour, in process with a scripted engine whose speed and failures
the test controls: deadlines, the bounded queue, engine failures, draining, the body limit, and what a
finished request leaves behind (speculation object, metrics, output log)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch
from lookupspec.gateway.app import build_service, create_app
from lookupspec.gateway.config import GatewayConfig, Limits

from lookupspec.engine import SequenceState, StepOutput
from lookupspec.params import SpecParams
from lookupspec.runtime.kvpool import LayerSpec, SlotPool
from lookupspec.service.service import Service
from lookupspec.store import open_store
from lookupspec.text import TextEngine


class ScriptedEngine:
    """The engine's batch API with scripted steps: every output is token id 65 + i % 26 (i counts the
    sequence's outputs), 'drafts' 2 context tokens and accepts 1; each step sleeps ``delay`` seconds.
    With ``fail`` a prefill raises; with ``gate`` set, every step waits for it (a stuck engine)."""

    prefill_chunk = None
    prefix_cache = None

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.delay = delay
        self.fail = fail
        self.gate: threading.Event | None = None
        self.context_window = 256
        self.vocab_size = 512
        self.default_spec = SpecParams()
        self.steps_run = 0
        # a KV pool of its own, never written: the service reports the engine's cache in /metrics
        self.runner = SimpleNamespace(pool=SlotPool([LayerSpec(1, 2, 2)], dtype=torch.float32, max_slots=1))

    def check_prompt(self, prompt_ids: Any) -> tuple[int, ...]:
        return tuple(prompt_ids)

    def start(self, prompt: Any, params: Any, spec: Any = None, scope: Any = None,
              namespace: Any = None) -> SequenceState:
        return SequenceState(tuple(prompt), params, spec or self.default_spec, params.sampling, 0,
                             context=list(prompt))

    def _out(self, seq: SequenceState) -> StepOutput:
        i = seq.generated
        seq.stats.observe(draft=2, accepted=1, emitted=1, source_draft={"context": 2},
                          source_accepted={"context": 1})
        seq.generated += 1
        seq.context.append(65 + i % 26)
        reason = "length" if seq.generated == seq.params.max_tokens else None
        seq.finish_reason = reason
        return StepOutput((65 + i % 26,), reason, draft_tokens=2, accepted_tokens=1, stats=seq.stats)

    def prefill(self, seq: SequenceState, max_tokens: Any = None) -> StepOutput:
        if self.fail:
            raise RuntimeError("scripted engine failure")
        seq.prefilled = len(seq.prompt)
        return self._out(seq)

    def fork(self, parent: SequenceState, params: Any) -> tuple[SequenceState, StepOutput]:
        child = self.start(parent.prompt, params, parent.spec)
        child.prefilled = len(child.prompt)
        return child, self._out(child)

    def step(self, seqs: Any, max_rows: Any = None) -> list[StepOutput]:
        time.sleep(self.delay)
        if self.gate is not None:
            self.gate.wait()
        self.steps_run += len(seqs)
        return [self._out(s) for s in seqs]

    def release(self, seq: SequenceState) -> None:
        seq.released = True

    def rollback(self, seq: SequenceState) -> None:
        pass


@pytest.fixture
def make_service(tmp_path: Path, text_engine) -> Iterator[Callable[..., tuple[Any, Service]]]:
    made: list[Service] = []

    def make(engine: ScriptedEngine, **config: Any) -> tuple[Any, Service]:
        te = TextEngine(text_engine.loaded, engine=engine)
        store = open_store(tmp_path / f"data{len(made)}", None)
        service = build_service(te, store, GatewayConfig(model_name="scripted", **config))
        service.start()  # what the app's lifespan does under uvicorn
        made.append(service)
        return create_app(service, close_store=True), service

    yield make
    for service in made:
        service.close()
        service.store.close()


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=30)


BODY = {"model": "scripted", "prompt": "hello", "max_tokens": 8}


def test_a_finished_request_reports_speculation_metrics_and_appends_its_output(make_service,
                                                                               text_engine) -> None:
    app, service = make_service(ScriptedEngine())

    async def main() -> dict:
        async with client(app) as c:
            r = await c.post("/v1/completions", json={**BODY, "n": 2})
            assert r.status_code == 200, r.text
            return r.json()

    body = asyncio.run(main())
    assert [c["text"] for c in body["choices"]] == [text_engine.tokenizer.decode(list(range(65, 73)))] * 2
    spec = body["speculation"]
    assert spec["steps"] == 16 and spec["draft_tokens"] == 32 and spec["accepted_tokens"] == 16
    assert spec["acceptance_length"] == 2.0 and spec["accepted_per_position"] == [16]
    assert spec["source_shares"] == {"context": 1.0}
    prompt = len(text_engine.encode_prompt(prompt="hello"))  # counted once, although n=2
    assert body["usage"] == {"prompt_tokens": prompt, "completion_tokens": 16, "total_tokens": prompt + 16,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    service.flush_outputs()
    outputs = service.store.state.outputs("default")
    assert [list(o) for o in outputs] == [list(range(65, 73))] * 2
    text = service.metrics.render().decode()
    assert 'lookupspec_spec_decode_num_accepted_tokens_per_pos_total{position="0"} 16.0' in text
    assert 'lookupspec_spec_decode_num_draft_tokens_by_source_total{source="context"} 32.0' in text
    assert "lookupspec_spec_decode_num_drafts_total 16.0" in text


def test_the_deadline_ends_a_slow_request_with_504_or_a_final_error_event(make_service) -> None:
    engine = ScriptedEngine(delay=0.05)
    app, service = make_service(engine, request_timeout_s=0.4)

    async def main() -> tuple[httpx.Response, str, httpx.Response]:
        async with client(app) as c:
            plain = await c.post("/v1/completions", json={**BODY, "max_tokens": 200})
            stream = await c.post("/v1/completions", json={**BODY, "max_tokens": 200, "stream": True})
            # A stuck generation: the request waiting behind it still gets its 504 in time.
            engine.gate = threading.Event()
            first = asyncio.create_task(c.post("/v1/completions", json={**BODY, "max_tokens": 200}))
            while not service.snapshot()["running"]:
                await asyncio.sleep(0.005)
            second = await c.post("/v1/completions", json={**BODY, "max_tokens": 2})
            engine.gate.set()
            assert (await first).status_code == 504
            return plain, stream.text, second

    t0 = time.monotonic()
    plain, stream, queued = asyncio.run(main())
    assert time.monotonic() - t0 < 10
    assert plain.status_code == 504 and plain.json()["error"]["code"] == "request_timeout"
    events = [e[len("data: "):] for e in stream.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "request_timeout"
    assert queued.status_code == 504
    assert engine.steps_run < 3 * 200  # every slow generation was stopped at its deadline


@pytest.mark.parametrize("max_batch", [1, 3])
def test_requests_beyond_the_slots_and_the_queue_get_429_with_retry_after(make_service, max_batch) -> None:
    """Capacity is max_batch running sequences plus max_queue requests waiting for a slot. The engine's
    steps wait at a gate until the rejections are in, so no admitted request can finish (and free
    its place) before the last one arrives, however slow the machine."""
    engine = ScriptedEngine(delay=0.02)
    engine.gate = threading.Event()
    app, service = make_service(engine, max_queue=1, max_batch=max_batch)

    async def main() -> list[httpx.Response]:
        async with client(app) as c:
            tasks = [asyncio.ensure_future(c.post("/v1/completions", json={**BODY, "max_tokens": 20}))
                     for _ in range(max_batch + 3)]
            pending = set(tasks)
            deadline = time.monotonic() + 10  # a capacity that admits everything opens the gate here
            while len(tasks) - len(pending) < 2 and time.monotonic() < deadline:
                _, pending = await asyncio.wait(pending, timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
            engine.gate.set()
            return list(await asyncio.gather(*tasks))

    responses = asyncio.run(main())
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * (max_batch + 1) + [429, 429]
    for r in responses:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1 and r.json()["error"]["code"] == "queue_full"
    assert 'lookupspec_requests_rejected_total{reason="queue_full"} 2.0' in service.metrics.render().decode()


def test_an_engine_failure_is_a_500_and_repeated_failures_make_health_503(make_service) -> None:
    engine = ScriptedEngine(fail=True)
    app, _ = make_service(engine)

    async def main() -> tuple[list[httpx.Response], httpx.Response, httpx.Response]:
        async with client(app) as c:
            failed = [await c.post("/v1/completions", json=BODY) for _ in range(3)]
            sick = await c.get("/health")
            engine.fail = False
            assert (await c.post("/v1/completions", json=BODY)).status_code == 200
            return failed, sick, await c.get("/health")

    failed, sick, healthy = asyncio.run(main())
    assert all(r.status_code == 500 and r.json()["error"]["code"] == "engine_error" for r in failed)
    assert sick.status_code == 503 and sick.json()["status"] == "dead"
    assert healthy.status_code == 200


def test_draining_refuses_new_requests(make_service) -> None:
    app, service = make_service(ScriptedEngine())
    service.begin_drain()

    async def main() -> tuple[httpx.Response, httpx.Response]:
        async with client(app) as c:
            return await c.post("/v1/completions", json=BODY), await c.get("/ready")

    refused, ready = asyncio.run(main())
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert ready.status_code == 503 and ready.json() == {"status": "draining"}


def test_a_chunked_body_over_the_limit_is_413_before_the_app_reads_it(make_service) -> None:
    app, _ = make_service(ScriptedEngine(), limits=Limits(max_body_bytes=1000))
    sent: list[dict] = []
    chunks = [b'{"model": "scripted", "prompt": "', b"x" * 600, b"y" * 600, b'"}']

    async def main() -> None:
        async def receive() -> dict:
            body = chunks.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(chunks)}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
                 "headers": [(b"content-type", b"application/json"), (b"transfer-encoding", b"chunked")],
                 "scheme": "http", "server": ("gateway", 80), "client": ("test", 1), "root_path": ""}
        await app(scope, receive, send)

    asyncio.run(main())
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["error"]["code"] == "payload_too_large"
    assert len(chunks) == 1  # the rest of the body was never read
