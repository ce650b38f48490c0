"""Property-based tests of the whole HTTP API with schemathesis, driven by the app's own OpenAPI schema,
against a real server (no API keys: the default namespace; a small context window so that any valid
request generates quickly). Valid requests must succeed or fail cleanly as documented; invalid ones
must be rejected with a 4xx; no request may get a 5xx or a response that violates the schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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


def test_default_namespace_without_keys(server: Gateway) -> None:
    with server.client() as c:
        r = c.post("/v1/collections/notes/documents", json={"documents": [{"id": "n1", "text": "hello"}]})
        assert r.status_code == 200, r.text
        assert c.get("/v1/collections/notes").json()["document_count"] == 1
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "lookup": {"collections": ["notes"]}}
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
