"""What an adversarial probe of `lookupspec serve` found (issue 53), against real servers on the tiny
model: an unbounded request head read before authentication, bodies that stall forever (and hold the
drain), null that was not the default, a top_p float32 cannot hold, a redirect built from the Host
header, and error messages that did not say what was wrong. Raw sockets where the HTTP itself is the
point; httpx elsewhere."""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_harness import KEY_ALPHA, MODEL, Gateway
from lookupspec.gateway.protocol import ChatCompletionRequest, CompletionRequest

pytestmark = pytest.mark.slow

HEAD_LIMIT = 32 * 1024  # --max-header-bytes of the module's server
AUTH = b"Authorization: Bearer " + KEY_ALPHA.encode() + b"\r\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Gateway]:
    g = Gateway(tiny_model, tmp_path_factory.mktemp("hardening"), name="hardening", args=[
        "--api-key", f"{KEY_ALPHA}:alpha", "--max-model-len", "256", "--max-header-bytes", str(HEAD_LIMIT),
        "--body-timeout", "1"])
    g.start().wait_ready()
    yield g
    g.stop()


@pytest.fixture
def alpha(server: Gateway) -> Iterator[httpx.Client]:
    with server.client(KEY_ALPHA) as c:
        yield c


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """(head, body) of one response on ``sock``, read until the server closes it."""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    head, _, body = out.partition(b"\r\n\r\n")
    return head, body


def rss_kb(g: Gateway) -> int:
    assert g.proc is not None
    for line in Path(f"/proc/{g.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# ---- 1. the request head is bounded, before authentication ----------------------------------------


def test_an_oversized_request_head_is_431_before_any_key_is_checked_and_is_not_read(server: Gateway) -> None:
    offered = 32 * 2**20  # 32 MB of one header, from a client without a key
    rss_before = rss_kb(server)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent, piece = 0, b"a" * 65536
        try:
            while sent < offered:
                sent += s.send(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass
        head, body = read_response(s)
    assert head.startswith(b"HTTP/1.1 431"), head
    err = json.loads(body)["error"]
    assert (err["type"], err["code"]) == ("invalid_request_error", "request_header_fields_too_large"), err
    assert str(HEAD_LIMIT) in err["message"]
    assert sent < offered  # the server stopped reading: the rest never left this process
    assert rss_kb(server) - rss_before < offered // 1024 // 4  # nowhere near the header's size
    assert httpx.get(server.url + "/health").status_code == 200


def test_heads_and_bodies_within_the_limits_are_served(server: Gateway, alpha: httpx.Client) -> None:
    # a head just under the bound, and a body far larger than it in the same request
    padding = {"X-Pad": "p" * (HEAD_LIMIT - 1024)}
    assert alpha.get("/v1/models", headers=padding).status_code == 200
    docs = [{"id": f"d{i}", "text": "word " * 4000} for i in range(8)]  # ~160 KB of body
    r = alpha.post("/v1/collections/big-body/documents", json={"documents": docs}, headers=padding)
    assert r.status_code == 200, r.text
    # keep-alive: a second request on the same connection is bounded afresh, not by the first's bytes
    for _ in range(3):
        assert alpha.get("/v1/models", headers=padding).status_code == 200


# ---- 2. a stalled body is timed out, and does not hold the drain ----------------------------------


def stalled_upload(port: int) -> socket.socket:
    """A documents upload that announces 100 bytes of body, sends 2, and stalls."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v1/collections/x/documents HTTP/1.1\r\nHost: x\r\n" + AUTH +
              b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"")
    return s


def test_a_stalled_body_gets_408_in_openai_shape(server: Gateway) -> None:
    with stalled_upload(server.port) as s:
        head, body = read_response(s)
    assert head.startswith(b"HTTP/1.1 408"), head
    err = json.loads(body)["error"]
    assert err["code"] == "request_timeout" and err["type"] == "invalid_request_error", err


def test_sigterm_with_stalled_uploads_answers_them_503_and_exits_cleanly(gateways) -> None:
    g = gateways("stalled", "--api-key", f"{KEY_ALPHA}:alpha", "--drain-timeout", "5",
                 "--body-timeout", "600")
    g.start().wait_ready()
    clients = [stalled_upload(g.port) for _ in range(50)]
    try:
        # every stalled request is past its head (so counted in flight) once this round trip is back
        assert httpx.get(g.url + "/health").status_code == 200
        g.signal(signal.SIGTERM)
        assert g.wait(120) == 0
        answers = [read_response(s) for s in clients]
    finally:
        for s in clients:
            s.close()
    statuses = [head.split(b" ")[1] if head else b"closed" for head, _ in answers]
    assert b"500" not in statuses, statuses
    answered = [(head, body) for head, body in answers if head]
    assert len(answered) >= 40, statuses  # the rest, if any, were closed before their head was read
    for head, body in answered:
        assert head.startswith(b"HTTP/1.1 503") and json.loads(body)["error"]["code"] == "shutting_down"
    log = g.log_tail(200_000)
    assert "Traceback" not in log and "timeout graceful shutdown exceeded" not in log.lower(), log[-3000:]


# ---- 3. null means the default, on every optional field -------------------------------------------


def _optional_fields(model: type) -> list[str]:
    return [name for name, f in model.model_fields.items() if not f.is_required()]


@pytest.mark.parametrize(("path", "model"), [("/v1/completions", CompletionRequest),
                                             ("/v1/chat/completions", ChatCompletionRequest)])
def test_a_null_field_and_an_omitted_one_are_the_same_request(alpha: httpx.Client, path: str,
                                                              model: type) -> None:
    base: dict[str, Any] = {"model": MODEL, "temperature": 1.0, "seed": 3, "max_tokens": 5}
    base |= {"prompt": "Once upon a time"} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": "Once upon a time", "name": None}]}
    for field in _optional_fields(model):
        omitted = {k: v for k, v in base.items() if k != field}
        if field == "seed":
            omitted["temperature"] = 0  # without a seed sampling is not repeatable
        nulled = {**omitted, field: None}
        a, b = alpha.post(path, json=omitted), alpha.post(path, json=nulled)
        assert (a.status_code, b.status_code) == (200, 200), (field, a.text, b.text)
        ja, jb = a.json(), b.json()
        assert ja["usage"] == jb["usage"] and ja["choices"] == jb["choices"], field


def test_max_tokens_null_is_16_on_a_streamed_completion(alpha: httpx.Client) -> None:
    """The probe's reproduction: null generated toward the whole window."""
    def streamed(extra: dict[str, Any]) -> list[dict[str, Any]]:
        body = {"model": MODEL, "prompt": "Once upon a time", "stream": True, "temperature": 0,
                "stream_options": {"include_usage": True}, **extra}
        with alpha.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]

    nulled, omitted = streamed({"max_tokens": None}), streamed({})
    assert nulled[-1]["usage"] == omitted[-1]["usage"]
    assert nulled[-1]["usage"]["completion_tokens"] <= 16
    text = "".join(c["choices"][0]["text"] for c in nulled if c["choices"])
    assert text == "".join(c["choices"][0]["text"] for c in omitted if c["choices"])


def test_nulls_in_nested_objects_mean_their_defaults(alpha: httpx.Client) -> None:
    r = alpha.post("/v1/collections/nulls/documents",
                   json={"documents": [{"id": "d", "text": "some text", "metadata": None}]})
    assert r.status_code == 200, r.text
    assert alpha.get("/v1/collections/nulls/documents/d").json()["metadata"] == {}
    base = {"model": MODEL, "prompt": "some text", "max_tokens": 4, "temperature": 0}
    plain = alpha.post("/v1/completions", json={**base, "lookup": {}}).json()
    for lookup in ({"enabled": None}, {"collections": None, "documents": None},
                   {"max_draft_tokens": None, "sources": None}):
        r = alpha.post("/v1/completions", json={**base, "lookup": lookup})
        assert r.status_code == 200, (lookup, r.text)
        assert r.json()["choices"] == plain["choices"]


# ---- 4. a top_p float32 cannot hold --------------------------------------------------------------


@pytest.mark.parametrize("top_p", [1e-46, 5e-324, 1e-45])
def test_a_tiny_top_p_gives_the_most_likely_tokens_and_text_that_matches_the_usage(alpha: httpx.Client,
                                                                                   text_engine,
                                                                                   top_p: float) -> None:
    base = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6}
    greedy = alpha.post("/v1/completions", json={**base, "temperature": 0}).json()
    r = alpha.post("/v1/completions", json={**base, "temperature": 1, "seed": 3, "top_p": top_p})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["text"] == greedy["choices"][0]["text"]
    assert out["usage"] == greedy["usage"]
    text = out["choices"][0]["text"]
    # the text is what the counted tokens decode to (token 0, this tokenizer's special, decodes to "")
    assert len(text_engine.tokenizer.encode(text, add_special_tokens=False)) > 0
    assert out["usage"]["completion_tokens"] == 6 or out["choices"][0]["finish_reason"] == "stop"


# ---- 6. no redirect built from the Host header ----------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/collections/", "/v1/models/", "/health/"])
def test_a_trailing_slash_is_not_redirected_to_the_host_a_client_names(server: Gateway, path: str) -> None:
    r = httpx.get(server.url + path, headers={"Host": "evil.example", "Authorization": f"Bearer {KEY_ALPHA}"},
                  follow_redirects=False)
    assert "location" not in r.headers, r.headers
    assert error_of(r, 404)["code"] in ("not_found", "model_not_found")  # /v1/models/ names model ""


# ---- 7. errors that say what is wrong -------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_too_many_stop_strings_says_so(alpha: httpx.Client, path: str) -> None:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2, "stop": [f"s{i}" for i in range(100)]}
    body |= {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    err = error_of(alpha.post(path, json=body), 400)
    assert err["param"] == "stop" and "at most 16 stop sequences" in err["message"], err
    assert err["code"] == "invalid_value"


@pytest.mark.parametrize(("raw", "says"), [
    (b'{"model": "m", "prompt": "\xff\xfe"}', "UTF-8"),
    (b'{"model": "m", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", "digits"),
    (b'{"a":' * 1000 + b"1" + b"}" * 1000, "nested"),
])
def test_a_body_that_cannot_be_parsed_gets_a_code_and_the_reason(alpha: httpx.Client, raw: bytes,
                                                                 says: str) -> None:
    r = alpha.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    err = error_of(r, 400)
    assert err["code"] == "invalid_value" and says in err["message"], err


def test_head_answers_as_get_does(server: Gateway) -> None:
    wrong = {"Authorization": "Bearer sk-wrong"}
    assert httpx.get(server.url + "/health", headers=wrong).status_code == 401
    assert httpx.head(server.url + "/health", headers=wrong).status_code == 401
    assert httpx.head(server.url + "/health").status_code == 200
    got = httpx.get(server.url + "/metrics")
    head = httpx.head(server.url + "/metrics")
    assert (head.status_code, head.content) == (200, b"")
    assert head.headers["content-type"] == got.headers["content-type"]


@pytest.mark.parametrize("where", ["user", "name"])
def test_lone_surrogates_are_refused_in_user_and_message_names(alpha: httpx.Client, where: str) -> None:
    message: dict[str, Any] = {"role": "user", "content": "hi"}
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2, "messages": [message]}
    if where == "user":
        body["user"] = "\ud800"
        param = "user"
    else:
        message["name"] = "a\udfffb"
        param = "messages[0].name"
    r = alpha.post("/v1/chat/completions", content=json.dumps(body),
                   headers={"content-type": "application/json"})
    err = error_of(r, 400)
    assert err["param"] == param and "surrogate" in err["message"], err
