"""Property-based tests of the whole HTTP API with schemathesis, driven by the app's own OpenAPI schema,
against a real server (no API keys: the default namespace; a small context window so that any valid
request generates quickly). Valid requests must succeed or fail cleanly as documented; invalid ones
must be rejected with a 4xx; no request may get a 5xx or a response that violates the schema.

Besides the schema's own positive and negative cases, valid requests are mutated the way an outside
probe mutates them (issue 17): nulls, loose types, fields asking for unsupported behaviour, thousands
of unknown fields, deeply nested values, prompts far too long for the window. The same checks apply,
and afterwards every stored collection and document must still read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import schemathesis
from gateway_harness import MODEL, Gateway
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.slow

POSITIVE_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
                   response_schema_conformance]
NEGATIVE_CHECKS = [*POSITIVE_CHECKS, negative_data_rejection]
EXAMPLES = 25  # per operation and mode: about a minute on two slow cores


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Gateway]:
    g = Gateway(tiny_model, tmp_path_factory.mktemp("schema"), name="schema",
                args=["--max-model-len", "48", "--max-queue", "64", "--request-timeout", "60"])
    g.start().wait_ready()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def schema(server: Gateway) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


def _operations(schema: schemathesis.BaseSchema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


def test_openapi_schema_documents_every_route_with_openai_errors(server: Gateway) -> None:
    doc = httpx.get(server.url + "/openapi.json").json()
    paths = doc["paths"]
    for path in ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/collections",
                 "/v1/collections/{name}", "/v1/collections/{name}/documents",
                 "/v1/collections/{name}/documents/{doc_id}", "/health", "/ready", "/metrics"):
        assert path in paths, path
    chat = paths["/v1/chat/completions"]["post"]["responses"]
    assert "422" not in chat and {"200", "400", "401", "404", "429"} <= set(chat)
    assert "text/event-stream" in chat["200"]["content"]


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_api_conforms_to_its_schema(schema: schemathesis.BaseSchema, server: Gateway, mode: str) -> None:
    generation = schemathesis.GenerationMode.POSITIVE if mode == "positive" else \
        schemathesis.GenerationMode.NEGATIVE
    checks = POSITIVE_CHECKS if mode == "positive" else NEGATIVE_CHECKS
    failures: list[str] = []
    for operation in _operations(schema):
        # Half of the generated requests name the served model, so generation paths are reached
        # (a random model name is a 404 before any work).
        strategy = operation.as_strategy(generation_mode=generation)

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy, use_model=st.booleans())
        def run(case: schemathesis.Case, use_model: bool) -> None:
            if use_model and isinstance(case.body, dict) and "model" in case.body and mode == "positive":
                case.body["model"] = MODEL
            case.call_and_validate(base_url=server.url, checks=checks, timeout=60)

        try:
            run()
        except Unsatisfiable:
            assert mode == "negative"  # nothing to negate: an operation without (string-free) inputs
        except Exception as exc:  # collect every operation's failure, then report them together
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)
    health = server.health()
    assert health["status"] == "ok", health


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


_HOSTILE_FIELDS: list[tuple[str, Any]] = [
    ("stream", "yes"), ("max_tokens", True), ("n", "2"), ("temperature", "0.5"), ("seed", 1.5),
    ("tools", [{"type": "function", "function": {"name": "f"}}]), ("logprobs", True), ("echo", True),
    ("best_of", 3), ("logit_bias", {"1": 100}), ("response_format", {"type": "json_schema"}),
    ("frequency_penalty", 1.0), ("suffix", "tail"), ("top_logprobs", 5),
    ("x_deep", _nested(300)), ("lookup", {"documents": ["x" * 100], "sources": ["corpus"], "enabled": 1}),
]


def _mutate(body: dict[str, Any], kind: str, data: st.DataObject) -> None:
    """Apply one hostile mutation to a generated (valid) JSON body, in place."""
    if kind == "nulls":
        for key in data.draw(st.lists(st.sampled_from(sorted(body)), max_size=4, unique=True)):
            if key not in ("model", "prompt", "messages", "documents"):
                body[key] = None
    elif kind == "field":
        key, value = data.draw(st.sampled_from(_HOSTILE_FIELDS))
        body[key] = value
    elif kind == "unknown":
        body.update({f"x_probe_{i}": i for i in range(2000)})
    elif kind == "metadata" and isinstance(body.get("documents"), list) and body["documents"]:
        first = body["documents"][0]
        if isinstance(first, dict):
            first["metadata"] = _nested(data.draw(st.sampled_from([33, 64, 256])))
    elif kind == "long_prompt":
        text = "lorem ipsum " * 100_000  # 1.2 MB; the window is 48 tokens
        if "prompt" in body:
            body["prompt"] = text
        elif isinstance(body.get("messages"), list):
            body["messages"] = [{"role": "user", "content": text}]


def test_api_survives_hostile_mutations_of_valid_requests(schema: schemathesis.BaseSchema,
                                                          server: Gateway) -> None:
    failures: list[str] = []
    for operation in _operations(schema):
        if operation.method.upper() != "POST":
            continue
        strategy = operation.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE)

        @settings(max_examples=12, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy, kind=st.sampled_from(["nulls", "field", "unknown", "metadata", "long_prompt"]),
               data=st.data())
        def run(case: schemathesis.Case, kind: str, data: st.DataObject) -> None:
            if not isinstance(case.body, dict):
                return
            if "model" in case.body:
                case.body["model"] = MODEL
            _mutate(case.body, kind, data)
            case.call_and_validate(base_url=server.url, checks=POSITIVE_CHECKS, timeout=60)

        try:
            run()
        except Exception as exc:
            failures.append(f"{operation.label}: {exc}")
    assert not failures, "\n\n".join(failures)
    _every_record_reads(server)


def _every_record_reads(server: Gateway) -> None:
    """Every stored collection and document reads back, by the URL a client builds from its id."""
    with server.client() as c:
        listing = c.get("/v1/collections")
        assert listing.status_code == 200, listing.text
        for collection in listing.json()["data"]:
            detail = c.get(f"/v1/collections/{collection['name']}")
            assert detail.status_code == 200, detail.text
            for doc in detail.json()["documents"]:
                got = c.get(f"/v1/collections/{collection['name']}/documents/{quote(doc['id'], safe='')}")
                assert got.status_code == 200, got.text
                assert got.json()["id"] == doc["id"]
    assert server.health(digest="true")["status"] == "ok"


@pytest.mark.parametrize(("path", "raw"), [
    ("/v1/collections/deep/documents",
     '{"documents": [{"id": "d", "text": "t", "metadata": ' + '{"a":' * 3000 + "1" + "}" * 3000 + "}]}"),
    ("/v1/completions", '{"model": "M", "prompt": ' + "[" * 5000 + "]" * 5000 + "}"),
    ("/v1/chat/completions",
     '{"model": "M", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}'),
    ("/v1/completions", '{"model": "M", "prompt": "x", "max_tokens": true}'),
    ("/v1/completions", json.dumps({"model": "M", "prompt": "x", **{f"f{i}": 0 for i in range(50_000)}})),
])
def test_hostile_raw_bodies_are_openai_shaped_4xx(server: Gateway, path: str, raw: str) -> None:
    r = httpx.post(server.url + path, content=raw.replace('"M"', f'"{MODEL}"'),
                   headers={"content-type": "application/json"}, timeout=60)
    assert 400 <= r.status_code < 500 or (r.status_code == 200 and "f49999" in raw), r.text
    if r.status_code != 200:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    _every_record_reads(server)


def test_default_namespace_without_keys(server: Gateway) -> None:
    with server.client() as c:
        r = c.post("/v1/collections/notes/documents", json={"documents": [{"id": "n1", "text": "hello"}]})
        assert r.status_code == 200, r.text
        assert c.get("/v1/collections/notes").json()["document_count"] == 1
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "lookup": {"collections": ["notes"]}}
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
