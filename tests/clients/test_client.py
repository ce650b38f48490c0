"""lookupspec.client: the in-process and the gateway client answer the same requests with the same
text, statistics and errors (both serve the same tiny model, greedy, so tokens must match)."""

from __future__ import annotations

import asyncio

import pytest

from lookupspec.client import ClientError, GatewayClient, GenerationRequest, Lookup, connect
from lookupspec.stats import SPECULATION_KEYS

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three rivers."}]


@pytest.fixture(scope="module")
def remote(tiny_gateway):
    with GatewayClient(tiny_gateway.url) as client:
        yield client


@pytest.fixture(scope="module", params=["local", "gateway"])
def client(request, local_client, remote):
    return local_client if request.param == "local" else remote


@pytest.mark.parametrize("kind", ["prompt", "messages"])
def test_local_and_gateway_give_the_same_text_usage_and_finish(local_client, remote, kind) -> None:
    req = (GenerationRequest(prompt="The history of the lighthouse", max_tokens=24) if kind == "prompt"
           else GenerationRequest(messages=CHAT, max_tokens=24))
    here, there = local_client.complete(req), remote.complete(req)
    assert here.text == there.text and here.text
    assert here.usage == there.usage
    assert here.usage["completion_tokens"] == 24 and here.finish_reason == there.finish_reason == "length"
    assert set(here.speculation) == set(there.speculation) == set(SPECULATION_KEYS)
    assert here.speculation["steps"] >= 1 and here.seconds > 0 and here.first_token_s is not None


def test_stream_and_astream_concatenate_to_complete(client) -> None:
    req = GenerationRequest(prompt="A list of fruits:", max_tokens=20)
    whole = client.complete(req)
    deltas = list(client.stream(req))
    assert "".join(d.text for d in deltas) == whole.text
    assert all(d.finish_reason is None for d in deltas[:-1])
    last = deltas[-1]
    assert last.finish_reason == "length" and last.usage == whole.usage and last.speculation

    async def collect():
        return [d async for d in client.astream(req)]

    adeltas = asyncio.run(collect())
    assert "".join(d.text for d in adeltas) == whole.text and adeltas[-1].usage == whole.usage


def test_stop_strings_cut_the_text(client) -> None:
    full = client.complete(GenerationRequest(prompt="Counting:", max_tokens=24)).text
    stop = full[len(full) // 2: len(full) // 2 + 2]
    assert stop.strip(), "the tiny model's text should have non-space characters mid-way"
    cut = client.complete(GenerationRequest(prompt="Counting:", max_tokens=24, stop=(stop,)))
    assert cut.finish_reason == "stop" and cut.text == full[:full.index(stop)]


def test_collections_and_inline_documents_are_drafted_from(client) -> None:
    # A random tiny model's output does not re-tokenize to the same ids, so its drafts from a text copy
    # are mostly rejected: this checks that the corpus drafter sees the documents (drafts proposed),
    # and that the text stays exact; acceptance is covered by the engine and real-model suites.
    prompt = f"Notes on {type(client).__name__}: the archive says"
    first = client.complete(GenerationRequest(prompt=prompt, max_tokens=32, lookup=Lookup(enabled=False)))
    assert first.speculation["draft_tokens"] == 0  # plain decoding
    copy = prompt + first.text
    collection = f"notes-{type(client).__name__.lower()}"
    assert client.add_documents(collection, [{"id": "n1", "text": copy}]) == 1
    for lookup in (Lookup(collections=(collection,), sources=("corpus",)),
                   Lookup(documents=(copy,), sources=("corpus",))):
        again = client.complete(GenerationRequest(prompt=prompt, max_tokens=32, lookup=lookup))
        assert again.text == first.text
        assert again.speculation["draft_tokens_by_source"].get("corpus", 0) > 0, lookup
    plain = GenerationRequest(prompt=prompt, max_tokens=32, lookup=Lookup(sources=("corpus",)))
    without = client.complete(plain)
    assert without.text == first.text and without.speculation["draft_tokens"] == 0


def _outputs(client, gateway) -> int:
    """Outputs in the gateway's output log (0 in process: there they are appended before the last
    delta, the gateway appends them just after its response)."""
    if not isinstance(client, GatewayClient):
        return 0
    import httpx

    return httpx.get(gateway.url + "/health").json()["store"]["outputs"]


def _wait_for_outputs(client, gateway, count: int) -> None:
    import time

    if not isinstance(client, GatewayClient):
        return
    deadline = time.monotonic() + 10
    while _outputs(client, gateway) < count:
        assert time.monotonic() < deadline, "the output was not appended"
        time.sleep(0.02)


def test_both_clients_plan_lookup_scope_and_output_appends_the_same_way(client, tiny_gateway) -> None:
    """One planning path (lookupspec.planning) for both: the output of a request that did not
    speculate still feeds later requests; the output index and inline documents are used only when
    speculating with their source."""
    prompt = f"Planning rules seen by {type(client).__name__}: one, two,"
    plain = GenerationRequest(prompt=prompt, max_tokens=24, lookup=Lookup(enabled=False))
    before = _outputs(client, tiny_gateway)
    first = client.complete(plain)
    assert first.speculation["draft_tokens"] == 0
    _wait_for_outputs(client, tiny_gateway, before + 1)
    from_output = client.complete(GenerationRequest(prompt=prompt, max_tokens=24,
                                                    lookup=Lookup(sources=("output",))))
    assert from_output.text == first.text
    assert from_output.speculation["draft_tokens_by_source"].get("output", 0) > 0, from_output.speculation
    for lookup in (Lookup(sources=("context",)), Lookup(enabled=False, sources=("output",))):
        other = client.complete(GenerationRequest(prompt=prompt, max_tokens=24, lookup=lookup))
        assert other.text == first.text
        assert other.speculation["draft_tokens_by_source"].get("output", 0) == 0, lookup
    # inline documents are no source unless "corpus" is
    inline = client.complete(GenerationRequest(prompt=prompt, max_tokens=24, lookup=Lookup(
        documents=(prompt + first.text,), sources=("context",))))
    assert inline.text == first.text and inline.speculation["draft_tokens_by_source"].get("corpus", 0) == 0


def test_bad_requests_raise_client_errors_naming_the_parameter(client) -> None:
    with pytest.raises(ClientError) as err:
        client.complete(GenerationRequest(prompt="x", lookup=Lookup(collections=("no-such",))))
    assert err.value.status == 404 and err.value.param == "lookup.collections[0]"
    with pytest.raises(ClientError) as err:
        client.complete(GenerationRequest(prompt="x", top_p=0.0))
    assert err.value.status == 400 and err.value.param == "top_p"
    with pytest.raises(ClientError) as err:
        client.complete(GenerationRequest(prompt="x", lookup=Lookup(sources=("nope",))))
    assert err.value.status == 400 and err.value.param is not None and "sources" in err.value.param
    with pytest.raises(ClientError, match="exactly one"):
        GenerationRequest()


def test_leaving_a_stream_early_frees_the_client(client) -> None:
    req = GenerationRequest(prompt="Once upon a time", max_tokens=64)

    async def first_delta():
        async for delta in client.astream(req):
            if delta.text:
                return delta.text
        return ""

    assert asyncio.run(first_delta())
    gen = client.stream(req)
    next(gen)
    gen.close()
    assert client.complete(GenerationRequest(prompt="Again", max_tokens=4)).usage["completion_tokens"] == 4


def test_unreachable_gateway_is_a_client_error_with_status_0() -> None:
    from redis_harness import free_port

    c = connect(f"http://127.0.0.1:{free_port()}", model="m", timeout=2.0)
    with pytest.raises(ClientError) as err:
        c.complete(GenerationRequest(prompt="x", max_tokens=2))
    c.close()
    assert err.value.status == 0


def test_in_process_requests_are_counted_in_the_engine_aggregate(local_client) -> None:
    """The engine records a request before its last step is handed out: a consumer that stops at
    finish_reason (as every client does) must not lose it."""
    aggregate = local_client.engine.engine.aggregate
    before = aggregate.requests
    local_client.complete(GenerationRequest(prompt="Counted", max_tokens=3))
    assert aggregate.requests == before + 1


def test_a_closed_local_client_refuses_requests_and_starts_no_scheduler(local_client) -> None:
    """`lookupspec summarize` retries a 503 after 0.5 s, and Ctrl-C closes its client with requests in
    flight: the retry must not start a new scheduler thread, whose forwards would run while the
    process exits (an abort at interpreter shutdown)."""
    from lookupspec.client import LocalClient

    c = LocalClient(local_client.engine)  # the module's engine, a client of its own
    assert c.complete(GenerationRequest(prompt="Before", max_tokens=2)).usage["completion_tokens"] == 2
    c.close()
    with pytest.raises(ClientError) as err:
        c.complete(GenerationRequest(prompt="After", max_tokens=2))
    assert err.value.status == 503 and err.value.code == "shutting_down"
    assert not c.service.worker_alive  # closing started no new scheduler
    c.close()  # closing twice is harmless
