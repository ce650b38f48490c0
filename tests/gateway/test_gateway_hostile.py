"""The kinds of input an outside probe sends (issue 17), against one real `lookupspec serve` (tiny model,
embedded store, two API keys and an admin key) with real clients (the official `openai` package,
httpx, a raw socket): hostile documents and prompts, fields the server does not support, loose
types, the unauthenticated surface, and what a client sees while the server starts."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from gateway_harness import KEY_ALPHA, KEY_BETA, MODEL, Gateway

from lookupspec.store import open_store

pytestmark = pytest.mark.slow

ADMIN = "sk-admin-5555555555"
MESSAGES = [{"role": "user", "content": "Say something."}]


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def nested_json(depth: int) -> str:
    """The same as json.dumps(nested(depth)), without json's recursion (a deep value is the point)."""
    return '{"a":' * (depth - 1) + '{"leaf":1}' + "}" * (depth - 1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Gateway]:
    workdir = tmp_path_factory.mktemp("hostile")
    # A record written by an earlier version, which stored metadata 256 levels deep: it must read.
    with open_store(workdir / "data", None) as store:
        store.add_document("alpha", "legacy", "deep", "an old document", np.array([5, 6, 7], dtype=np.int32),
                           nested(256))
    g = Gateway(tiny_model, workdir, name="hostile", health_key=ADMIN, args=[
        "--api-key", f"{KEY_ALPHA}:alpha", "--api-key", f"{KEY_BETA}:beta", "--admin-key", ADMIN,
        "--max-model-len", "256"])
    g.start()
    g.startup = _watch_startup(g)  # type: ignore[attr-defined]
    yield g
    g.stop()


def _watch_startup(g: Gateway, timeout: float = 180.0) -> list[tuple[str, Any]]:
    """Poll the starting server as a load balancer and a client would: what /health, /ready and a /v1
    request answered, in order, until /ready is 200."""
    seen: list[tuple[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert g.proc is not None and g.proc.poll() is None, g.log_tail()
        try:
            health = httpx.get(g.url + "/health", timeout=60)
            seen.append(("health", (health.status_code, health.json()["status"])))
            ready = httpx.get(g.url + "/ready", timeout=60)
            seen.append(("ready", (ready.status_code, ready.json()["status"])))
            if ready.status_code == 200:
                return seen
            v1 = httpx.get(g.url + "/v1/models", headers={"Authorization": f"Bearer {KEY_ALPHA}"},
                           timeout=60)
            code = v1.json()["error"]["code"] if v1.status_code >= 400 else "ok"
            seen.append(("v1", (v1.status_code, code)))
        except httpx.ConnectError:
            seen.append(("connect", "refused"))
        time.sleep(0.02)
    raise AssertionError(f"not ready in {timeout} s: {seen[-5:]}\n{g.log_tail()}")


@pytest.fixture
def alpha(server: Gateway) -> Iterator[httpx.Client]:
    with server.client(KEY_ALPHA) as c:
        yield c


@pytest.fixture(scope="module")
def oai(server: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY_ALPHA, max_retries=0, timeout=60)


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


# ---- start-up (item 14) ----------------------------------------------------------------------------


def test_startup_answers_loading_before_ready_and_logs_model_and_address(server: Gateway) -> None:
    seen = server.startup  # type: ignore[attr-defined]
    loading = [answer for kind, answer in seen if kind == "health" and answer[1] == "loading"]
    assert loading and all(code == 200 for code, _ in loading), seen  # alive while loading
    assert ("ready", (503, "loading")) in seen, seen
    v1 = {answer for kind, answer in seen if kind == "v1"}
    assert (503, "loading") in v1 and v1 <= {(503, "loading"), (200, "ok")}, seen  # 200: it became ready
    log = server.log_tail(20_000)
    assert f"listening on http://127.0.0.1:{server.port}" in log
    model_line = next(line for line in log.splitlines() if line.startswith("model: "))
    for part in (MODEL, "float32 on cpu", "threads", "context window 256 tokens", "speculation on",
                 "draft tokens", "sources context,corpus,output,draft_model"):
        assert part in model_line, (part, model_line)
    assert log.index("listening on") < log.index("model: ")  # bound before the model was loaded


# ---- documents: metadata bounds (item 1) -----------------------------------------------------------


@pytest.mark.parametrize(("metadata", "what"), [
    (nested_json(256), "nested"), (nested_json(33), "nested"),
    (json.dumps({"blob": "x" * (64 * 1024)}), "bytes"),
])
def test_metadata_too_deep_or_too_big_is_400_and_nothing_is_stored(alpha: httpx.Client, metadata: str,
                                                                   what: str) -> None:
    raw = '{"documents": [{"id": "d", "text": "t", "metadata": ' + metadata + "}]}"
    r = alpha.post("/v1/collections/meta/documents", content=raw,
                   headers={"content-type": "application/json"})
    err = error_of(r, 400)
    assert err["param"] == "documents[0].metadata" and what in err["message"], err
    assert alpha.get("/v1/collections/meta").status_code == 404


def test_metadata_within_the_bounds_is_stored_and_reads_back(alpha: httpx.Client) -> None:
    meta = nested(32)
    r = alpha.post("/v1/collections/meta-ok/documents",
                   json={"documents": [{"id": "d", "text": "t", "metadata": meta}]})
    assert r.status_code == 200, r.text
    assert alpha.get("/v1/collections/meta-ok/documents/d").json()["metadata"] == meta
    assert alpha.get("/v1/collections/meta-ok").json()["documents"][0]["metadata"] == meta


@pytest.mark.parametrize("doc_id", [".", "..", "a/../b", "./a", "a/."])
def test_a_document_id_no_url_could_reach_is_400(alpha: httpx.Client, doc_id: str) -> None:
    r = alpha.post("/v1/collections/ids/documents", json={"documents": [{"id": doc_id, "text": "t"}]})
    assert error_of(r, 400)["param"] == "documents[0].id"


def test_a_stored_record_with_deep_metadata_still_reads(server: Gateway, alpha: httpx.Client) -> None:
    doc = alpha.get("/v1/collections/legacy/documents/deep")
    assert doc.status_code == 200, doc.text
    assert doc.json()["metadata"] == nested(256)
    collection = alpha.get("/v1/collections/legacy")
    assert collection.status_code == 200 and collection.json()["documents"][0]["metadata"] == nested(256)
    assert alpha.get("/v1/collections").status_code == 200
    assert "digest" in server.health(digest="true")


# ---- unknown fields (item 2) -----------------------------------------------------------------------


def test_unknown_fields_cost_bounded_log_volume(server: Gateway, alpha: httpx.Client) -> None:
    before = len(server.log_tail(10**9))
    for request in range(4):
        body = {"model": MODEL, "prompt": "x", "max_tokens": 1,
                **{f"x_probe_{request}_{i:05d}": 0 for i in range(4000)}}
        assert alpha.post("/v1/completions", json=body).status_code == 200
    logged = server.log_tail(10**9)[before:]
    assert "and 3992 more" in logged
    assert len(logged) < 4000, f"{len(logged)} bytes of log for 4 requests"


def test_unknown_field_names_remembered_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    from lookupspec.gateway.unknown_fields import UnknownFields

    fields = UnknownFields(max_remembered=256)
    with caplog.at_level(logging.DEBUG, logger="lookupspec.gateway.unknown_fields"):
        for request in range(50):
            fields.observe([f"f{request}-{i}" for i in range(4000)])
    assert fields.remembered == 256
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) <= 256 // 8 + 1 + 1  # 8 new names per request until full, then one notice
    assert max(len(r.getMessage()) for r in caplog.records) < 1000


# ---- prompts too long for the window (item 6) -----------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_prompt_too_long_for_the_window_is_refused_before_tokenizing(alpha: httpx.Client,
                                                                       path: str) -> None:
    text = "lorem ipsum dolor sit amet " * 450_000  # 12 MB: ~8 s of tokenizing on this tokenizer
    messages = [{"role": "user", "content": text}]
    body = {"prompt": text} if path == "/v1/completions" else {"messages": messages}
    t0 = time.monotonic()
    r = alpha.post(path, json={"model": MODEL, "max_tokens": 4, **body}, timeout=60)
    elapsed = time.monotonic() - t0
    err = error_of(r, 400)
    assert (err["code"], err["param"]) == ("context_length_exceeded", "input_tokens")
    assert elapsed < 3.0, f"{elapsed:.1f} s: the prompt was tokenized"


def test_a_prompt_at_the_byte_bound_that_fits_is_served(alpha: httpx.Client, text_engine) -> None:
    """The bound is L * (window - 1) countable bytes (lookupspec.prompt_bound); a prompt made of the
    tokenizer's longest token reaches it exactly and still fits, so it must be served."""
    piece = "\n" + " " * 12  # one 13-byte token, the longest this tokenizer has
    bound = text_engine.prompt_bound
    window = 256
    assert bound.bytes_per_token == len(piece.encode())
    fits = piece * (window - 1)  # 255 tokens: one position left for the completion
    assert len(text_engine.encode_prompt(prompt=fits)) == window - 1
    assert bound.countable_bytes(fits) == bound.limit(window)
    r = alpha.post("/v1/completions", json={"model": MODEL, "prompt": fits, "max_tokens": 1})
    assert r.status_code == 200, r.text
    err = error_of(alpha.post("/v1/completions", json={"model": MODEL, "prompt": fits + piece}), 400)
    assert err["code"] == "context_length_exceeded"


# ---- params in errors (item 7) ---------------------------------------------------------------------


def test_errors_name_the_param_that_is_wrong(alpha: httpx.Client) -> None:
    err = error_of(alpha.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES,
                                                            "max_completion_tokens": 10_000}), 400)
    assert (err["param"], err["code"]) == ("max_completion_tokens", "context_length_exceeded")
    err = error_of(alpha.post("/v1/completions", json={"model": MODEL, "prompt": ["p"] * 17}), 400)
    assert err["param"] == "prompt"
    err = error_of(alpha.post("/v1/completions", json={"model": MODEL, "prompt": [[1, 2]] * 17}), 400)
    assert err["param"] == "prompt"
    err = error_of(alpha.post("/v1/completions", json={"model": MODEL, "prompt": ["p"] * 3, "n": 6}), 400)
    assert err["param"] == "n"


# ---- OpenAI compatibility (item 9) -----------------------------------------------------------------


def test_null_means_the_default(alpha: httpx.Client) -> None:
    base = {"model": MODEL, "prompt": "Once", "max_tokens": 6, "seed": 11}
    defaults = alpha.post("/v1/completions", json={**base, "temperature": 1.0, "top_p": 1.0, "n": 1})
    nulls = alpha.post("/v1/completions", json={**base, "temperature": None, "top_p": None, "n": None,
                                                "top_k": None, "stream": None, "stream_options": None,
                                                "logit_bias": None, "tools": None})
    assert defaults.status_code == nulls.status_code == 200, nulls.text
    assert nulls.json()["choices"][0]["text"] == defaults.json()["choices"][0]["text"]
    chat = alpha.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2,
                                                    "temperature": None, "stream": None, "logprobs": None,
                                                    "max_completion_tokens": None, "response_format": None})
    assert chat.status_code == 200, chat.text


@pytest.mark.parametrize(("field", "value", "param"), [
    ("stream", "yes", "stream"), ("max_tokens", True, "max_tokens"), ("n", "2", "n"),
    ("temperature", "0.5", "temperature"), ("top_k", 1.5, "top_k"), ("seed", False, "seed"),
    ("lookup", {"enabled": "no"}, "lookup.enabled"), ("stream_options", {"include_usage": 1},
                                                      "stream_options.include_usage"),
])
def test_types_are_strict(alpha: httpx.Client, field: str, value: Any, param: str) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, "stream": True, field: value}
    assert error_of(alpha.post("/v1/chat/completions", json=body), 400)["param"] == param


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "auto"},
     "tool_choice"),  # the tiny model's chat template takes no tools
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema"),
    ({"logit_bias": {"5000": 10}}, "logit_bias"),
    ({"top_logprobs": 3}, "top_logprobs"),
])
def test_chat_fields_with_values_the_server_cannot_serve_are_400_naming_them(oai: openai.OpenAI, kwargs: dict,
                                                                             param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, **kwargs)
    assert err.value.body["param"] == param


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"echo": True}, "echo"), ({"best_of": 2}, "best_of"), ({"suffix": "def"}, "suffix"),
])
def test_completion_fields_asking_for_missing_behaviour_are_400_naming_them(oai: openai.OpenAI, kwargs: dict,
                                                                            param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        oai.completions.create(model=MODEL, prompt="x", max_tokens=2, **kwargs)
    assert err.value.body["param"] == param


def test_their_default_or_empty_values_are_accepted(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, tools=[],
                                    tool_choice="none", parallel_tool_calls=True,
                                    response_format={"type": "text"}, logit_bias={},
                                    logprobs=False, top_logprobs=0, frequency_penalty=0, presence_penalty=0,
                                    modalities=["text"])
    assert r.choices[0].finish_reason in ("stop", "length")
    c = oai.completions.create(model=MODEL, prompt="x", max_tokens=2, echo=False, best_of=1, suffix="",
                               frequency_penalty=0.0)
    assert c.choices[0].finish_reason in ("stop", "length")


def test_head_on_health_and_ready(server: Gateway) -> None:
    for path in ("/health", "/ready"):
        r = httpx.head(server.url + path)
        assert r.status_code == 200 and r.content == b"", path


def _raw(server: Gateway, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


@pytest.mark.parametrize("length", [b"abc", b"-1", b"1e3", b"5, 7"])
def test_a_malformed_content_length_gets_an_openai_error(server: Gateway, length: bytes) -> None:
    raw = _raw(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Authorization: Bearer " + KEY_ALPHA.encode() + b"\r\nContent-Length: " + length +
                       b"\r\n\r\n{}")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head.lower(), raw
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"


# ---- the unauthenticated surface (item 10) ---------------------------------------------------------


def test_health_shows_detail_and_digest_only_to_the_admin_key(server: Gateway) -> None:
    def get(key: str | None, **params: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.get(server.url + "/health", params=params, headers=headers)

    anonymous = get(None)
    assert anonymous.status_code == 200 and anonymous.json() == {"status": "ok"}
    assert error_of(get(None, digest="true"), 401)["param"] == "digest"
    assert get(KEY_ALPHA).json() == {"status": "ok"}  # a tenant sees no replica-wide detail
    error_of(get(KEY_ALPHA, digest="true"), 401)
    error_of(get("sk-wrong"), 401)
    full = get(ADMIN, digest="true").json()
    assert full["status"] == "ok" and "path" in full["store"] and len(full["digest"]) == 64
    assert httpx.get(server.url + "/ready").json() == {"status": "ready"}
