"""The OpenAI-compatible API, the documents API, errors, auth, metrics and load, against one real
`lookupspec serve` process (tiny model, embedded store, two API keys), with real clients: the official
`openai` package and httpx."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from gateway_harness import KEY_ALPHA, KEY_BETA, MODEL, Gateway, sse_events
from reference import complete

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Summarize: the quick brown fox jumps over the lazy dog."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Gateway]:
    workdir = tmp_path_factory.mktemp("api")
    g = Gateway(tiny_model, workdir, name="api", health_key=KEY_ALPHA, args=[
        "--api-key", f"{KEY_ALPHA}:alpha", "--api-key", f"{KEY_BETA}:beta", "--max-queue", "4",
        "--max-documents", "8", "--max-document-bytes", "4096", "--max-body-bytes", "65536"])
    g.start().wait_ready()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def oai(server: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY_ALPHA, max_retries=0, timeout=120)


@pytest.fixture
def alpha(server: Gateway) -> Iterator[httpx.Client]:
    with server.client(KEY_ALPHA) as c:
        yield c


@pytest.fixture
def beta(server: Gateway) -> Iterator[httpx.Client]:
    with server.client(KEY_BETA) as c:
        yield c


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


# ---- OpenAI client: outputs equal the in-process engine's ------------------------------------------


def test_models_lists_the_served_model(oai: openai.OpenAI) -> None:
    assert [m.id for m in oai.models.list().data] == [MODEL]
    assert oai.models.retrieve(MODEL).id == MODEL


def test_chat_completion_equals_in_process_engine(oai: openai.OpenAI, text_engine) -> None:
    expected = complete(text_engine, messages=MESSAGES, max_tokens=24, temperature=0.0)
    got = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0)
    assert got.choices[0].message.content == expected.text
    assert got.choices[0].finish_reason == expected.finish_reason
    assert got.usage.prompt_tokens == expected.prompt_tokens
    assert got.usage.completion_tokens == expected.completion_tokens
    spec = got.model_extra["speculation"]
    assert spec["steps"] >= 1 and spec["acceptance_length"] >= 1.0


def test_streamed_chat_equals_in_process_engine(oai: openai.OpenAI, text_engine) -> None:
    expected = complete(text_engine, messages=MESSAGES, max_tokens=40, temperature=0.0)
    stream = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=40,
                                         temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [expected.finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == expected.completion_tokens
    assert last.model_extra["speculation"]["steps"] >= 1


def test_seeded_sampling_with_n_and_batched_prompts_equals_in_process(oai: openai.OpenAI,
                                                                      text_engine) -> None:
    prompts = ["def add(a, b):", "Once upon a time"]
    got = oai.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=12, temperature=0.9,
                                 top_p=0.95, seed=1234, extra_body={"top_k": 50})
    assert [c.index for c in got.choices] == [0, 1, 2, 3]
    for c in got.choices:
        p, j = divmod(c.index, 2)
        want = complete(text_engine, prompt=prompts[p], max_tokens=12, temperature=0.9, top_p=0.95, top_k=50,
                                    seed=1234 + j)
        assert c.text == want.text, (c.index, c.text, want.text)
    # usage counts each prompt once, and every sample's tokens
    assert got.usage.prompt_tokens == sum(len(text_engine.encode_prompt(prompt=p)) for p in prompts)


def test_streamed_completion_with_stop_string_equals_in_process(oai: openai.OpenAI, text_engine) -> None:
    full = complete(text_engine, prompt="hello world", max_tokens=32, temperature=0.0).text
    stop = full[10:13]
    assert stop and stop.strip(), full
    expected = complete(text_engine, prompt="hello world", max_tokens=32, temperature=0.0, stop=[stop])
    stream = oai.completions.create(model=MODEL, prompt="hello world", max_tokens=32, temperature=0,
                                    stop=stop, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == "stop" == expected.finish_reason


def test_sse_wire_format(alpha: httpx.Client) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 6, "temperature": 0, "stream": True, "n": 2,
            "stream_options": {"include_usage": True}, "user": "u1"}
    with alpha.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    assert all(part.startswith("data: ") for part in raw.split("\n\n") if part)
    with alpha.stream("POST", "/v1/chat/completions", json=body) as r:
        events = list(sse_events(r))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["choices"][0]["index"] for c in chunks[:2]} == {0, 1}
    assert all(c["choices"][0]["delta"]["role"] == "assistant" for c in chunks[:2])
    assert all(c["object"] == "chat.completion.chunk" and "usage" in c for c in chunks)
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    assert set(usage["speculation"]) >= {"steps", "draft_tokens", "accepted_tokens", "acceptance_length",
                                         "source_shares"}
    ends = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(c["choices"][0]["index"] for c in ends) == [0, 1] and all("speculation" in c for c in ends)


# ---- the lookup extension and the documents API --------------------------------------------------


def test_documents_api_and_lookup_extension(alpha: httpx.Client) -> None:
    docs = [{"id": "intro", "text": "The gateway drafts from documents.", "metadata": {"lang": "en"}},
            {"id": "guide/setup.md", "text": "Install it, then run lookupspec serve."}]
    r = alpha.post("/v1/collections/handbook/documents", json={"documents": docs})
    assert r.status_code == 200, r.text
    added = r.json()
    assert added["added"] == 2 and added["buffered"] is False
    assert all(d["token_count"] > 0 for d in added["documents"])
    assert [c["name"] for c in alpha.get("/v1/collections").json()["data"]] == ["handbook"]
    detail = alpha.get("/v1/collections/handbook").json()
    assert detail["document_count"] == 2
    assert {d["id"] for d in detail["documents"]} == {"intro", "guide/setup.md"}
    doc = alpha.get("/v1/collections/handbook/documents/guide/setup.md").json()
    assert doc["text"] == docs[1]["text"]

    body = {"model": MODEL, "prompt": "Install it, then", "max_tokens": 8, "temperature": 0,
            "lookup": {"collections": ["handbook"], "documents": ["Install it, then run it."],
                       "max_draft_tokens": 8, "sources": ["corpus", "context"]}}
    r = alpha.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    spec = r.json()["speculation"]
    assert set(spec["draft_tokens_by_source"]) <= {"corpus", "context"}
    plain = alpha.post("/v1/completions", json={**body, "lookup": {"enabled": False}}).json()
    assert plain["choices"][0]["text"] == r.json()["choices"][0]["text"]  # speculation never changes tokens
    assert plain["speculation"]["draft_tokens"] == 0

    assert alpha.delete("/v1/collections/handbook/documents/intro").json()["deleted"] is True
    error_of(alpha.delete("/v1/collections/handbook/documents/intro"), 404)
    assert alpha.get("/v1/collections/handbook").json()["document_count"] == 1
    assert alpha.delete("/v1/collections/handbook").json()["deleted"] is True
    assert error_of(alpha.get("/v1/collections/handbook"), 404)["code"] == "collection_not_found"


def test_size_limits_are_413(alpha: httpx.Client) -> None:
    many = [{"id": f"d{i}", "text": "x"} for i in range(9)]
    assert error_of(alpha.post("/v1/collections/c/documents", json={"documents": many}), 413)["param"] == \
        "documents"
    big = [{"id": "big", "text": "y" * 5000}]
    assert error_of(alpha.post("/v1/collections/c/documents", json={"documents": big}), 413)["param"] == \
        "documents[0].text"
    error_of(alpha.post("/v1/completions", json={"model": MODEL, "prompt": "z" * 70000}), 413)
    inline = {"model": MODEL, "prompt": "a", "lookup": {"documents": ["d"] * 17}}
    assert error_of(alpha.post("/v1/completions", json=inline), 413)["param"] == "lookup.documents"
    assert alpha.get("/v1/collections/c").status_code == 404  # nothing was written


# ---- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "param"), [
    ({"temperature": 3}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"n": 0}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"seed": -1}, "seed"),
    ({"stop": ["ok", ""]}, "stop[1]"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"stream_options": 5}, "stream_options"),
    ({"lookup": {"sources": ["telepathy"]}}, "lookup.sources[0]"),
    ({"lookup": {"max_draft_tokens": 1000}}, "lookup.max_draft_tokens"),
    ({"lookup": {"collections": ["bad name!"]}}, "lookup.collections[0]"),
    ({"model": None}, "model"),
])
def test_invalid_chat_fields_are_400_naming_the_param(alpha: httpx.Client, body: dict, param: str) -> None:
    request = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **body}
    err = error_of(alpha.post("/v1/chat/completions", json=request), 400)
    assert err["param"] == param and err["type"] == "invalid_request_error", err


def test_context_window_errors_name_input_tokens_or_max_tokens(alpha: httpx.Client, text_engine) -> None:
    window = text_engine.engine.context_window
    err = error_of(alpha.post("/v1/completions", json={"model": MODEL, "prompt": [5] * window}), 400)
    assert (err["param"], err["code"]) == ("input_tokens", "context_length_exceeded")
    err = error_of(alpha.post("/v1/completions", json={"model": MODEL, "prompt": [5] * 10,
                                                       "max_tokens": window}), 400)
    assert (err["param"], err["code"]) == ("max_tokens", "context_length_exceeded")
    err = error_of(alpha.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES,
                                                            "max_completion_tokens": window}), 400)
    assert err["param"] == "max_completion_tokens"
    # null is the default (16 on completions), as omitted is: it does not fit two positions
    for extra in ({"max_tokens": None}, {}):
        err = error_of(alpha.post("/v1/completions", json={"model": MODEL, "prompt": [5] * (window - 2),
                                                           **extra}), 400)
        assert (err["param"], err["code"]) == ("max_tokens", "context_length_exceeded")


def test_other_errors_are_openai_shaped(alpha: httpx.Client) -> None:
    assert error_of(alpha.post("/v1/chat/completions", json={"model": "gpt-9", "messages": MESSAGES}),
                    404)["param"] == "model"
    err = error_of(alpha.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                       "lookup": {"collections": ["missing"]}}), 404)
    assert err["param"] == "lookup.collections[0]" and err["code"] == "collection_not_found"
    assert error_of(alpha.post("/v1/completions", content=b"{not json",
                               headers={"content-type": "application/json"}), 400)["param"] is None
    assert error_of(alpha.post("/v1/completions", json=[1, 2]), 400)
    assert error_of(alpha.post("/v1/completions", json={"model": MODEL, "prompt": [1, 99999]}),
                    400)["param"] == "prompt"
    assert error_of(alpha.post("/v1/completions", json={"model": MODEL, "prompt": ""}), 400)["param"] == \
        "prompt"
    error_of(alpha.get("/v1/completions"), 405)
    error_of(alpha.get("/v1/nothing-here"), 404)
    error_of(alpha.get("/v1/models/gpt-9"), 404)
    assert error_of(alpha.get("/v1/collections/bad%20name"), 400)["param"] == "name"


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/completions", b'{"model": "M", "prompt": "x\\ud800y"}', "prompt"),
    ("/v1/chat/completions", b'{"model": "M", "messages": [{"role": "user", "content": "\\udfff"}]}',
     "messages[0].content"),
    ("/v1/completions", b'{"model": "M", "prompt": "x", "lookup": {"documents": ["\\ud800"]}}',
     "lookup.documents[0]"),
    ("/v1/completions", b'{"model": "M", "prompt": "x", "temperature": NaN}', "temperature"),
    ("/v1/collections/c/documents", b'{"documents": [{"id": "a", "text": "\\ud800"}]}', "documents[0].text"),
    ("/v1/collections/c/documents", b'{"documents": [{"id": "a", "text": "t", "metadata": {"v": NaN}}]}',
     "documents[0].metadata"),
    ("/v1/completions", b"\xff\xfe", None),
])
def test_hostile_bodies_are_400_not_500(alpha: httpx.Client, path: str, raw: bytes,
                                        param: str | None) -> None:
    r = alpha.post(path, content=raw.replace(b'"M"', f'"{MODEL}"'.encode()),
                   headers={"content-type": "application/json"})
    assert error_of(r, 400)["param"] == param


def test_unknown_fields_are_accepted(alpha: httpx.Client, server: Gateway) -> None:
    # frequency_penalty and logit_bias are OpenAI fields: their neutral values are accepted silently
    r = alpha.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2,
                                                 "frequency_penalty": 0, "logit_bias": {}, "x_custom": 1,
                                                 "x_other": {"a": 1}})
    assert r.status_code == 200, r.text
    assert "ignoring unknown request fields: x_custom, x_other" in server.log_tail()


# ---- auth and namespaces ---------------------------------------------------------------------------


def test_requests_without_a_valid_key_get_401(server: Gateway) -> None:
    with server.client() as anon:
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                             ("GET", "/v1/collections"), ("DELETE", "/v1/collections/x")):
            err = error_of(anon.request(method, path, json={}), 401)
            assert err["code"] == "invalid_api_key"
        assert anon.get("/health").status_code == 200 and anon.get("/metrics").status_code == 200
    with server.client("sk-wrong") as wrong:
        error_of(wrong.get("/v1/models"), 401)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="sk-wrong", max_retries=0).models.list()


def test_namespaces_do_not_see_each_others_documents(alpha: httpx.Client, beta: httpx.Client) -> None:
    r = alpha.post("/v1/collections/private/documents", json={"documents": [{"id": "s", "text": "secret"}]})
    assert r.status_code == 200
    assert "private" not in [c["name"] for c in beta.get("/v1/collections").json()["data"]]
    error_of(beta.get("/v1/collections/private"), 404)
    error_of(beta.get("/v1/collections/private/documents/s"), 404)
    error_of(beta.delete("/v1/collections/private"), 404)
    err = error_of(beta.post("/v1/completions", json={"model": MODEL, "prompt": "secret",
                                                      "lookup": {"collections": ["private"]}}), 404)
    assert err["param"] == "lookup.collections[0]"
    assert alpha.get("/v1/collections/private/documents/s").json()["text"] == "secret"


def _generate_ids(client: httpx.Client, prompt: list[int], **lookup: object) -> dict:
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 48,
                                             "temperature": 0, "lookup": lookup})
    assert r.status_code == 200, r.text
    return r.json()


def _wait_for_outputs(server: Gateway, count: int) -> None:
    """Outputs reach the output log just after their response (off the request path)."""
    deadline = time.monotonic() + 10
    while server.health()["store"]["outputs"] < count:
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_namespaces_never_draft_from_each_others_outputs_or_documents(
        server: Gateway, alpha: httpx.Client, beta: httpx.Client, text_engine) -> None:
    prompt = text_engine.encode_prompt(prompt="Isolation check: the namespace alpha writes")
    outputs = server.health()["store"]["outputs"]
    first = _generate_ids(alpha, prompt, sources=["output"])
    _wait_for_outputs(server, outputs + 1)
    # control: alpha's own output log makes alpha's repeat draft from "output" (so a leak would show)
    again = _generate_ids(alpha, prompt, sources=["output"])
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    assert again["speculation"]["accepted_tokens_by_source"].get("output", 0) > 0
    other = _generate_ids(beta, prompt, sources=["output"])
    assert other["choices"][0]["text"] == first["choices"][0]["text"]
    assert other["speculation"]["draft_tokens_by_source"].get("output", 0) == 0

    # documents: the same collection name in both namespaces, with different contents
    text = text_engine.tokenizer.decode(prompt) + first["choices"][0]["text"]
    assert alpha.post("/v1/collections/shared-name/documents",
                      json={"documents": [{"id": "a", "text": text}]}).status_code == 200
    assert beta.post("/v1/collections/shared-name/documents",
                     json={"documents": [{"id": "b", "text": "unrelated words about gardening"}]}
                     ).status_code == 200
    mine = _generate_ids(alpha, prompt, sources=["corpus"], collections=["shared-name"])
    assert mine["speculation"]["accepted_tokens_by_source"].get("corpus", 0) > 0  # control
    theirs = _generate_ids(beta, prompt, sources=["corpus"], collections=["shared-name"])
    assert theirs["speculation"]["accepted_tokens_by_source"].get("corpus", 0) == 0


# ---- operations ------------------------------------------------------------------------------------


def test_health_ready_and_metrics(server: Gateway, alpha: httpx.Client) -> None:
    alpha.post("/v1/completions", json={"model": MODEL, "prompt": "metrics", "max_tokens": 4})
    health = server.health()
    assert health["status"] == "ok" and health["engine"]["ok"] and health["store"]["backend"] == "embedded"
    assert httpx.get(server.url + "/ready").json() == {"status": "ready"}
    m = server.metrics()
    for name in ("lookupspec_spec_decode_num_drafts_total", "lookupspec_spec_decode_num_draft_tokens_total",
                 "lookupspec_spec_decode_num_accepted_tokens_total", "lookupspec_queue_depth",
                 "lookupspec_time_to_first_token_seconds_count",
                 "lookupspec_inter_token_latency_seconds_count",
                 "lookupspec_store_documents", 'lookupspec_store_healthy{backend="embedded"}',
                 "lookupspec_store_buffered_records", 'lookupspec_index_memory_bytes{kind="corpus"}',
                 "lookupspec_kv_cache_bytes", "lookupspec_kv_cache_resizes_total",
                 "lookupspec_kv_cache_resize_seconds_total"):
        assert name in m, name
    assert m["lookupspec_time_to_first_token_seconds_count"] >= 1
    assert m['lookupspec_http_requests_total{endpoint="/v1/completions",status="200"}'] >= 1
    assert m["lookupspec_store_healthy{backend=\"embedded\"}"] == 1.0


def test_client_disconnect_cancels_the_generation(server: Gateway, alpha: httpx.Client) -> None:
    def aborted() -> float:
        return server.metrics().get('lookupspec_requests_aborted_total{reason="disconnect"}', 0.0)

    before = aborted()
    body = {"model": MODEL, "prompt": "a long one", "max_tokens": 2000, "temperature": 0, "stream": True}
    with alpha.stream("POST", "/v1/completions", json=body) as r:
        events = sse_events(r)
        for _ in range(3):
            next(events)
    closed = time.monotonic()  # the connection is closed here, long before 2000 tokens
    while aborted() <= before:
        assert time.monotonic() - closed < 10, "the generation was not cancelled"
        time.sleep(0.05)
    assert server.metrics()["lookupspec_num_requests_running"] == 0


def test_32_concurrent_streaming_clients_get_no_5xx_and_every_429_has_retry_after(server: Gateway) -> None:
    async def client(i: int, http: httpx.AsyncClient) -> list[tuple[int, str | None, bool]]:
        results = []
        for _ in range(3):
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"client {i}"}],
                    "max_tokens": 8, "stream": True}
            async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                raw = (await r.aread()).decode()
                done = raw.endswith("data: [DONE]\n\n")
                results.append((r.status_code, r.headers.get("retry-after"), done))
        return results

    async def run() -> list[tuple[int, str | None, bool]]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {KEY_ALPHA}"},
                                     timeout=120, limits=limits) as http:
            per_client = await asyncio.gather(*(client(i, http) for i in range(32)))
        return [r for rs in per_client for r in rs]

    results = asyncio.run(run())
    statuses = [s for s, _, _ in results]
    assert len(results) == 96 and not [s for s in statuses if s >= 500]
    assert set(statuses) <= {200, 429} and statuses.count(200) >= 5 and 429 in statuses
    for status, retry_after, done in results:
        if status == 429:
            assert retry_after is not None and int(retry_after) >= 1
        else:
            assert done
    assert server.health()["queue"] == {"waiting": 0, "running": 0, "max_queue": 4}


# ---- prefix cache --------------------------------------------------------------------------------

PASSAGES = ("Use only these passages.\n" + "\n".join(
    f"Passage {i}: the with statement calls __enter__, binds its result, runs the block, then calls "
    f"__exit__ with any exception; it may suppress it by returning true." for i in range(8)))


def _ask(client: openai.OpenAI, question: str) -> tuple[str, int]:
    r = client.chat.completions.create(model=MODEL, max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": PASSAGES}, {"role": "user", "content": question}])
    return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens


def test_prompts_that_share_a_prefix_reuse_its_kv_within_their_namespace(
        server: Gateway, oai: openai.OpenAI, text_engine) -> None:
    def metric(name: str) -> float:
        return server.metrics().get(f"lookupspec_prefix_cache_{name}_total", 0.0)

    hits_before = metric("hit_tokens")
    _, first = _ask(oai, "What does with call first?")
    text, cached = _ask(oai, "Can the block's exception be suppressed?")
    question = "Can the block's exception be suppressed?"
    want = complete(text_engine, messages=[{"role": "system", "content": PASSAGES},
                                          {"role": "user", "content": question}], max_tokens=12)
    assert text == want.text  # served from the cached prefix: the same answer
    asked = [text_engine.encode_prompt(messages=[{"role": "system", "content": PASSAGES},
                                                 {"role": "user", "content": q}])
             for q in ("What does with call first?", question)]
    common = next(i for i, (a, b) in enumerate(zip(*asked, strict=False)) if a != b)
    # the server's block: serve's default --prefill-chunk (128) decides it, on the same model
    from lookupspec.engine import Engine

    block = Engine(text_engine.engine.model, prefill_chunk=128).prefix_block_size
    prompt = len(text_engine.encode_prompt(messages=[{"role": "system", "content": PASSAGES},
                                                     {"role": "user", "content": "x"}]))
    assert cached >= 128 and cached < prompt and first == 0
    assert cached == min(common, len(asked[1]) - 1) // block * block  # every whole block they share
    assert metric("hit_tokens") - hits_before == cached
    beta = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY_BETA, max_retries=0, timeout=120)
    assert _ask(beta, question)[1] == 0  # alpha's prefix never leaks to beta
    assert _ask(beta, "What does with call last?")[1] == cached  # beta now has its own
