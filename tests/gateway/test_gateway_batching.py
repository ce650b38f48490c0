"""Continuous batching under load, through the official `openai` client against a real server: every
completed response equals the same request alone in process; streams cancelled mid-way free their
slots and cost the others nothing; a request past its deadline ends alone; malformed and oversized
requests get their 4xx without disturbing the running batch; the metrics show batched steps."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from gateway_harness import MODEL, Gateway
from reference import complete

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory) -> Gateway:
    root = tmp_path_factory.mktemp("batching")
    g = Gateway(tiny_model, root, name="batching",
                args=["--max-batch", "8", "--max-queue", "64", "--prefill-chunk", "64", "--kv-cache-mb", "64",
                      "--trace-iterations", str(root / "trace.jsonl")])
    g.start().wait_ready()
    yield g
    g.stop()


def _client(server: Gateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _prompt(i: int) -> str:
    return f"Request {i}: " + "the quick brown fox jumps over the lazy dog " * (1 + i % 4)


def test_32_streams_with_cancellations_deadlines_and_bad_requests(server: Gateway, text_engine) -> None:
    async def stream(client: openai.AsyncOpenAI, i: int) -> tuple[int, str, str | None]:
        cancel = i % 4 == 1  # a quarter of the clients leave after two chunks
        s = await client.completions.create(model=MODEL, prompt=_prompt(i), max_tokens=400 if cancel else 32,
                                            temperature=0 if i % 2 == 0 else 0.8, seed=i, stream=True,
                                            extra_body={"lookup": {"max_draft_tokens": 6}})
        text, reason, chunks = [], None, 0
        async for chunk in s:
            chunks += 1
            if chunk.choices:
                text.append(chunk.choices[0].text)
                reason = chunk.choices[0].finish_reason or reason
            if cancel and chunks == 2:
                await s.close()
                return i, "".join(text), "cancelled"
        return i, "".join(text), reason

    async def bad(http: httpx.AsyncClient) -> list[int]:
        await asyncio.sleep(0.5)  # while the batch runs
        out = []
        for body in ({"model": MODEL, "prompt": "x", "max_tokens": "many"},  # malformed
                     {"model": MODEL, "prompt": "x", "max_tokens": 10**6},  # over the window
                     {"model": MODEL, "prompt": "x", "temperature": -1}):
            out.append((await http.post("/v1/completions", json=body)).status_code)
        big = {"model": MODEL, "prompt": "y" * (17 * 2**20)}  # over the body limit
        out.append((await http.post("/v1/completions", json=big)).status_code)
        return out

    async def run():
        async with _client(server) as client, httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            streams = asyncio.gather(*(stream(client, i) for i in range(32)))
            return await streams, await bad(http)

    before = server.metrics()
    results, bad_codes = asyncio.run(run())
    assert bad_codes == [400, 400, 400, 413]
    for i, text, reason in results:
        if reason == "cancelled":
            continue
        want = complete(text_engine, prompt=_prompt(i), max_tokens=32, temperature=0 if i % 2 == 0 else 0.8,
                                    seed=i)
        assert (text, reason) == (want.text, want.finish_reason), f"request {i}"
    assert sum(r == "cancelled" for _, _, r in results) == 8
    # the cancelled slots were freed: nothing runs or waits once the streams are done
    deadline = time.monotonic() + 10
    while server.metrics()["lookupspec_num_requests_running"] != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    m = server.metrics()
    assert m["lookupspec_num_requests_waiting"] == 0
    steps = m["lookupspec_scheduler_steps_total"] - before.get("lookupspec_scheduler_steps_total", 0)
    name = "lookupspec_scheduler_step_sequences_total"
    seqs = m[name] - before.get(name, 0)
    assert seqs / steps > 3  # sequences really shared steps
    assert 16 <= m["lookupspec_scheduler_prefill_budget_tokens"] <= 128
    assert any(f'lookupspec_batch_steps_total{{batch_size="{b}"}}' in m for b in (6, 7, 8))
    assert m.get('lookupspec_requests_aborted_total{reason="engine_error"}', 0) == 0
    # --trace-iterations: a record per forward, in the file as the server runs (the last one lands
    # just after its iteration's outputs); they count the steps
    deadline = time.monotonic() + 5
    while True:
        lines = [json.loads(line) for line in (server.workdir / "trace.jsonl").read_text().splitlines()]
        recs = lines[1:]
        if sum(r["sequences"] > 0 for r in recs) == m["lookupspec_scheduler_steps_total"]:
            break
        assert time.monotonic() < deadline, (len(recs), m["lookupspec_scheduler_steps_total"])
        time.sleep(0.05)
    assert "start" in lines[0]
    assert all(r["forward_s"] > 0 for r in recs) and max(r["sequences"] for r in recs) >= 6
    assert any(r["sequences"] and r["chunk_tokens"] for r in recs)  # chunks rode on steps


def test_a_deadline_ends_only_its_own_request(gateways, text_engine) -> None:
    """--request-timeout 1.5 s: a 2000-token request running beside short ones is cut at its deadline
    (it is deterministic: seeded, and it reaches 2000 tokens in process, in ~4 s on the development
    CPU, so a deadline near that was a race); the short ones, which share its steps, complete
    normally."""
    server = gateways("deadline", "--max-batch", "4", "--request-timeout", "1.5").start().wait_ready()

    async def run():
        async with _client(server) as client:
            long = asyncio.create_task(client.completions.create(
                model=MODEL, prompt="a very long story", max_tokens=2000, temperature=1.0, seed=3))
            await asyncio.sleep(0.5)
            short = [await client.completions.create(model=MODEL, prompt=_prompt(i), max_tokens=24,
                                                     temperature=0) for i in range(3)]
            try:
                await long
            except openai.APIStatusError as exc:
                return short, exc.status_code
            return short, 200

    t0 = time.monotonic()
    short, status = asyncio.run(run())
    for i, r in enumerate(short):
        assert r.choices[0].text == complete(text_engine, prompt=_prompt(i), max_tokens=24).text
    assert status == 504 and time.monotonic() - t0 < 30
    m = server.metrics()
    assert m['lookupspec_requests_aborted_total{reason="deadline"}'] == 1
    assert m["lookupspec_num_requests_running"] == 0


def test_a_reserved_kv_cache_never_grows_under_load(server: Gateway, text_engine) -> None:
    """--kv-cache-mb reserves the cache at start: a load that grows a default server's cache (from
    1 to 4.5 MiB for this model, more slots and longer ones; every growth a pause for all streams;
    the pool's own tests check the counting) leaves the reserved one as it was, after the 32 streams
    above too when they ran first."""

    async def load() -> list[str]:
        async with _client(server) as client:
            out = await asyncio.gather(*(client.completions.create(
                model=MODEL, prompt=_prompt(i) * 8, max_tokens=12, temperature=0) for i in range(8)))
            return [r.choices[0].text for r in out]

    before = server.metrics()
    assert before["lookupspec_kv_cache_resizes_total"] == 1  # the reservation itself
    assert 4 * 2**20 < before["lookupspec_kv_cache_bytes"] <= 64 * 2**20
    for i, text in enumerate(asyncio.run(load())):
        assert text == complete(text_engine, prompt=_prompt(i) * 8, max_tokens=12, temperature=0).text
    after = server.metrics()
    assert after["lookupspec_kv_cache_resizes_total"] == 1
    assert after["lookupspec_kv_cache_bytes"] == before["lookupspec_kv_cache_bytes"]


def test_a_reserved_kv_cache_gives_sliding_window_layers_only_their_window(tiny_models, tmp_path) -> None:
    """tiny-gemma3 (three of its four layers sliding at W = 12) with --kv-cache-mb 2: the sliding
    layers reserve W - 1 plus one forward's rows (320 entries), the full layer the rest, so a slot
    holds 1,088 positions where counting every layer at full length gave 512. Eight streams of ~100 to
    ~390 positions (past the sliding layers' 320 entries: they drop what the window no longer sees),
    through the openai client, each equal the same request in process, and the cache never grows. A
    prompt longer than a slot's share gets a 400 naming it, not a 500."""
    from lookupspec.text import TextEngine

    name = "tiny-gemma3"
    g = Gateway(tiny_models[name], tmp_path, name="sliding",
                args=["--max-batch", "4", "--prefill-chunk", "16", "--kv-cache-mb", "2"])
    g.start().wait_ready()
    try:
        assert ("KV cache: 2 MiB reserved, 4 slots of 1088 positions; sliding-window layers (window 12) "
                "320 entries a slot") in g.log_tail(10**6)
        before = g.metrics()
        assert before["lookupspec_kv_cache_resizes_total"] == 1

        async def load() -> list[str]:
            async with _client(g) as client:
                out = await asyncio.gather(*(client.completions.create(
                    model=name, prompt=_prompt(i) * 3, max_tokens=40, temperature=0) for i in range(8)))
                return [r.choices[0].text for r in out]

        alone = TextEngine.load(str(tiny_models[name]))
        assert max(len(alone.encode_text(_prompt(i) * 3, add_special_tokens=True)) for i in range(8)) > 320
        for i, text in enumerate(asyncio.run(load())):
            assert text == complete(alone, prompt=_prompt(i) * 3, max_tokens=40, temperature=0).text
        after = g.metrics()
        assert after["lookupspec_kv_cache_resizes_total"] == 1
        assert after["lookupspec_kv_cache_bytes"] == before["lookupspec_kv_cache_bytes"] <= 2 * 2**20

        long_prompt = _prompt(3) * 10  # ~1,150 tokens: within the model's 2,048, past a slot's 1,088
        with g.client() as http:
            r = http.post("/v1/completions", json={"model": name, "prompt": long_prompt, "max_tokens": 4})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "input_tokens" and "1088 positions" in error["message"]
        assert error["code"] == "context_length_exceeded"
    finally:
        g.stop()
