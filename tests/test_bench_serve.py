"""`lookupspec bench-serve`: the pure parts (percentiles, token gaps, SSE parsing, the closed loop,
request bodies, /metrics deltas, summaries and exactness counts), a sweep against a fake server that
is not lookupspec, the short prompt set, and an end-to-end run on a tiny model."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest

from lookupspec.benchmarks.http_client import StreamedResponse, percentile, stream_chat, token_gaps
from lookupspec.benchmarks.prompts import KINDS, BenchPrompt, load_prompts
from lookupspec.benchmarks.serve import PROMPT_SETS, pass_keys
from lookupspec.benchmarks.serve_load import (
    LoadSettings,
    Target,
    closed_loop,
    cpu_times,
    level_requests,
    parse_metrics,
    pass_labels,
    pass_order,
    request_body,
    steal_fraction,
    sweep,
    warmup_prompts,
)
from lookupspec.benchmarks.serve_report import count_differences, server_rates, summarize_pass
from lookupspec.sse import DONE, parse_sse_line

PROMPTS = [BenchPrompt(f"p{i}", "k", ({"role": "user", "content": f"prompt {i}"},)) for i in range(3)]

# ----------------------------------------------------------------------------------------- percentiles


def test_percentile_is_nearest_rank():
    assert percentile([4, 1, 3, 2], 50) == 3  # index round(0.5 * 3) = 2 of 1 2 3 4
    assert percentile(list(range(101)), 99) == 99
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_token_gaps_split_an_event_of_k_tokens_into_k_gaps():
    assert token_gaps([0.0, 0.3, 0.4], [1, 3, 1]) == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert token_gaps([0.0, 0.2], [5, 0]) == pytest.approx([0.2])  # an event with text is >= 1 token
    assert token_gaps([1.0], [4]) == []  # the first event's wait is the TTFT
    # events of one network read are one arrival: 3 tokens after 0.3 s, then 1 after 0.1 s
    assert token_gaps([0.0, 0.3, 0.3, 0.4], [1, 1, 2, 1]) == pytest.approx([0.1, 0.1, 0.1, 0.1])
    with pytest.raises(ValueError):
        token_gaps([0.0, 1.0], [1])


# ----------------------------------------------------------------------------------------------- SSE


def test_parse_sse_line_reads_data_events_and_skips_the_rest():
    assert parse_sse_line('data: {"a": 1}') == {"a": 1}
    assert parse_sse_line('data:{"a": 1}') == {"a": 1}
    assert parse_sse_line("data: [DONE]") == DONE
    for line in ("", ": keep-alive", "event: message", "id: 7", "data: "):
        assert parse_sse_line(line) is None
    with pytest.raises(ValueError):
        parse_sse_line("data: [1, 2]")


def _chunk(content=None, finish=None, **extra):
    delta = {} if content is None else {"content": content}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def _sse_response(events):
    """A streamed chat completion carrying ``events``, then ``[DONE]``."""
    sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx.Response(200, content=sse.encode(), headers={"content-type": "text/event-stream"})


def test_a_lookupspec_stream_gives_text_times_usage_and_speculation():
    spec = {"steps": 4, "accepted_tokens": 6, "acceptance_length": 2.5}
    r = StreamedResponse(sent=10.0)
    events = [_chunk(""), _chunk("Hello"), _chunk(" wor"), _chunk("ld!"),
              _chunk(finish="length", speculation=spec),
              {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 11}, "speculation": spec}]
    for t, e in zip([10.1, 10.5, 10.6, 10.8, 10.9, 10.9], events, strict=True):
        assert r.feed(e, t)
    assert r.text == "Hello world!" and r.times == [10.5, 10.6, 10.8]  # the role chunk has no text
    assert r.ttft == pytest.approx(0.5) and r.chunk_gaps == pytest.approx([0.1, 0.2])
    assert (r.completion_tokens, r.finish_reason, r.speculation) == (11, "length", spec)


def test_error_events_end_the_stream_with_their_message():
    r = StreamedResponse(sent=0.0)
    assert not r.feed({"error": {"message": "shutting down", "code": "shutting_down"}}, 1.0)
    assert r.error == "shutting down"
    r = StreamedResponse(sent=0.0)
    assert not r.feed({"error": "CUDA out of memory"}, 1.0)  # transformers serve sends a string
    assert r.error == "CUDA out of memory"


def test_stream_chat_reads_an_sse_body_and_reports_http_errors():
    body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in (_chunk("a"), _chunk("b", "stop")))
    body += b": comment\n\ndata: [DONE]\n\n"

    def handler(request: httpx.Request) -> httpx.Response:
        sent = json.loads(request.content)
        if sent["model"] != "m":
            return httpx.Response(404, json={"error": {"message": "unknown model"}})
        assert sent["stream"] is True
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async def main():
        async with httpx.AsyncClient(base_url="http://x", transport=httpx.MockTransport(handler)) as http:
            return await stream_chat(http, {"model": "m"}), await stream_chat(http, {"model": "n"})

    ok, bad = asyncio.run(main())
    assert (ok.text, ok.finish_reason, ok.error, ok.usage) == ("ab", "stop", None, None)
    assert ok.finished is not None and ok.finished >= ok.times[-1]
    assert bad.status == 404 and bad.error.startswith("HTTP 404") and bad.text == ""


# ------------------------------------------------------------------------------------------ the loop


def test_closed_loop_keeps_n_requests_in_flight_and_refills_at_once():
    in_flight, peak, log = 0, 0, []

    async def send(client: int, index: int, item: float) -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        log.append((client, index))
        await asyncio.sleep(item)
        in_flight -= 1
        return f"r{index}"

    durations = [0.05, 0.01, 0.01, 0.01, 0.01]
    results = asyncio.run(closed_loop(durations, 2, send))
    assert results == [f"r{i}" for i in range(5)]  # in item order, each item once
    assert peak == 2
    # client 0 is busy with the slow item 0; client 1 takes every next item as soon as it is free
    assert log[:2] == [(0, 0), (1, 1)] and [c for c, i in log[2:]] == [1, 1, 1]
    assert asyncio.run(closed_loop([0.0], 8, send)) == ["r0"]  # never more clients than items


def test_level_requests_cover_every_prompt_and_at_least_one_per_stream():
    assert [p.id for p in level_requests(PROMPTS, 1, None)] == ["p0", "p1", "p2"]
    assert [p.id for p in level_requests(PROMPTS, 4, None)] == ["p0", "p1", "p2", "p0"]
    assert [p.id for p in level_requests(PROMPTS, 1, 5)] == ["p0", "p1", "p2", "p0", "p1"]


def test_pass_order_flips_the_modes_from_level_to_level():
    assert pass_order([1, 4, 8], ["on", "off"]) == [(1, "on"), (1, "off"), (4, "off"), (4, "on"),
                                                    (8, "on"), (8, "off")]
    assert pass_order([1, 2], ["server"]) == [(1, "server"), (2, "server")]


def test_request_bodies_toggle_speculation_only_on_lookupspec():
    ours, other = Target("http://x", "m", True), Target("http://x", "m", False)
    settings = LoadSettings(levels=(1,), modes=("on", "off"), max_tokens=32, extra_body={"seed": 3})
    on = request_body(ours, settings, PROMPTS[0], "on")
    assert on["lookup"] == {"enabled": True, "sources": ["context"]}
    assert (on["max_tokens"], on["temperature"], on["seed"]) == (32, 0, 3)
    assert on["messages"] == [{"role": "user", "content": "prompt 0"}]
    assert on["stream_options"] == {"include_usage": True}
    assert request_body(ours, settings, PROMPTS[0], "off")["lookup"] == {"enabled": False}
    every_source = LoadSettings(levels=(1,), modes=("on",), sources=None)
    assert request_body(ours, every_source, PROMPTS[0], "on")["lookup"] == {"enabled": True}
    assert "lookup" not in request_body(other, settings, PROMPTS[0], "server")


# ------------------------------------------------------------------------------------ metrics, report

METRICS = """# HELP lookupspec_decode_tokens_total tokens emitted by decode/verify steps
# TYPE lookupspec_decode_tokens_total counter
lookupspec_decode_tokens_total 300.0
lookupspec_decode_seconds_total 3.0
lookupspec_prefill_seconds_total 2.0
lookupspec_scheduler_steps_total 100.0
lookupspec_scheduler_step_sequences_total 250.0
lookupspec_scheduler_step_rows_total 500.0
lookupspec_batch_steps_total{batch_size="1"} 20.0
lookupspec_batch_steps_total{batch_size="4"} 80.0
lookupspec_batch_sequences_total{batch_size="1"} 20.0
lookupspec_batch_sequences_total{batch_size="4"} 320.0
lookupspec_batch_draft_nodes_total{batch_size="1"} 100.0
lookupspec_batch_draft_nodes_total{batch_size="4"} 640.0
lookupspec_spec_decode_num_steps_total 100.0
lookupspec_spec_decode_num_accepted_tokens_total 150.0
lookupspec_spec_decode_num_steps_created 1.7e9
lookupspec_prefix_cache_hit_tokens_total 64.0
"""


def test_server_rates_come_from_metric_deltas():
    m = parse_metrics(METRICS)
    assert m['lookupspec_batch_steps_total{batch_size="4"}'] == 80.0
    assert not any("_created" in k for k in m)
    before = {k: v / 2 for k, v in m.items()}  # the pass did half of every counter
    delta = {k: v - before[k] for k, v in m.items()}
    rates = server_rates(delta)
    assert rates["decode_tokens_per_s"] == 100.0  # 150 tokens / 1.5 s
    assert (rates["mean_batch"], rates["mean_rows_per_step"]) == (2.5, 5.0)
    assert rates["steps_by_batch"] == {1: 10, 4: 40}
    assert rates["draft_nodes_per_sequence_by_batch"] == {1: 5.0, 4: 2.0}
    assert rates["acceptance_length"] == 2.5
    assert rates["prefix_hit_tokens"] == 32
    assert server_rates({})["decode_tokens_per_s"] is None


def _record(pid, text, chunk_s, tokens=None, spec=None, error=None):
    return {"id": pid, "kind": "k", "client": 0, "start_s": 0.0, "ttft_s": chunk_s[0] if chunk_s else None,
            "latency_s": 1.0, "prompt_tokens": 10, "completion_tokens": None if error else len(text),
            "finish_reason": "length", "chunk_s": chunk_s, "chunk_tokens": tokens, "text": text,
            "speculation": spec, "error": error}


def test_summarize_pass_weights_acceptance_and_gaps_by_tokens():
    records = [_record("a", "xxxx", [0.1, 0.4], [1, 3], {"steps": 1, "accepted_tokens": 2}),
               _record("b", "yy", [0.3, 0.5], [1, 1], {"steps": 3, "accepted_tokens": 0}),
               _record("c", "", [], error="HTTP 429")]
    s = summarize_pass(records, 2.0, None)
    assert (s["requests"], s["errors"], s["output_tokens"]) == (3, 1, 6)
    assert (s["output_tokens_per_s"], s["requests_per_s"]) == (3.0, 1.0)
    assert s["ttft_p50_s"] == 0.1  # nearest rank of 0.1, 0.3: index round(0.5) = 0
    assert s["itl_p50_s"] == pytest.approx(0.1)  # gaps 0.1 x3 (0.3 over 3 tokens) and 0.2
    assert s["chunk_gap_p99_s"] == pytest.approx(0.3)
    assert s["acceptance_length"] == 1.5  # (2 + 0 + 4 steps) / 4 steps, not the mean of 3.0 and 1.0
    assert s["server"] is None and s["event_tokens_counted"] == 6


def test_busy_rate_counts_the_tokens_streamed_before_the_last_request_was_sent():
    first = _record("a", "xxxxx", [0.5, 1.5], [2, 3])
    second = dict(_record("b", "y", [0.2], [1]), start_s=1.0)  # its event arrives at 1.2
    s = summarize_pass([first, second], 2.0, None)
    assert s["busy_s"] == 1.0 and s["busy_tokens_per_s"] == 2.0  # only the event at 0.5 is in the window
    assert s["output_tokens_per_s"] == 3.0  # the whole pass: 6 tokens in 2 s
    uncounted = _record("c", "zz", [0.1, 0.3])  # no tokenizer: one token per event
    assert summarize_pass([uncounted, second], 2.0, None)["busy_tokens_per_s"] == 2.0  # 2 events in 1 s
    together = summarize_pass([_record("d", "w", [0.1], [1]), _record("e", "w", [0.1], [1])], 1.0, None)
    assert together["busy_s"] is None and together["busy_tokens_per_s"] is None  # all sent at once


def test_host_steal_is_read_from_proc_stat():
    line = "cpu  485902 0 16571 179025 1746 0 759 41186 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n"
    assert cpu_times(line) == (41186, 485902 + 16571 + 179025 + 1746 + 759 + 41186)
    assert cpu_times("cpu 1 2 3") is None and cpu_times("intr 5 6 7 8 9 10 11 12 13") is None
    assert steal_fraction((100, 1000), (130, 1200)) == 0.15
    assert steal_fraction(None, (1, 2)) is None and steal_fraction((1, 5), (1, 5)) is None
    if Path("/proc/stat").exists():  # Linux: the real file parses
        steal, total = cpu_times()
        assert 0 <= steal <= total


def test_count_differences_against_the_reference_level_and_on_against_off():
    def p(level, mode, texts):
        responses = [_record(pid, t, [0.1]) for pid, t in texts]
        return {"level": level, "mode": mode, "responses": responses,
                "summary": {"level": level, "mode": mode, "exactness": None, "on_vs_off": None}}

    passes = [p(1, "on", [("a", "A"), ("b", "B")]), p(1, "off", [("a", "A"), ("b", "B")]),
              p(8, "off", [("a", "A"), ("b", "X")]), p(8, "on", [("a", "A"), ("b", "B"), ("a", "A")])]
    count_differences(passes, 1)
    assert passes[0]["summary"]["exactness"] is None  # the reference itself
    assert passes[2]["summary"]["exactness"] == {"reference_level": 1, "compared": 2, "differ": 1,
                                                 "differ_ids": ["b"]}
    on8 = passes[3]["summary"]
    assert (on8["exactness"]["differ"], on8["exactness"]["compared"]) == (0, 3)
    assert on8["on_vs_off"]["differ"] == 1  # level 8 off says X for b
    assert passes[0]["summary"]["on_vs_off"]["differ"] == 0


def test_a_sweep_against_another_server_sends_no_lookup_field_and_reads_no_metrics():
    """A fake server that refuses unknown fields (as `transformers serve` does) and streams one token
    per event: one `server` pass per level, texts compared, no server columns."""
    seen: list[dict] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions", "no /metrics for other servers"
        body = json.loads(request.content)
        seen.append(body)
        if set(body) - {"model", "messages", "max_tokens", "temperature", "stream", "stream_options"}:
            return httpx.Response(422, json={"detail": "Unexpected fields"})
        await asyncio.sleep(0.001)
        words = body["messages"][-1]["content"].split()[: body["max_tokens"]]
        events = [_chunk(w + " ") for w in words] + [_chunk(finish="length")]
        return _sse_response(events)

    target = Target("http://other", "m", False)
    settings = LoadSettings(levels=(1, 2), modes=("server",), max_tokens=20, warmup=1)
    passes = asyncio.run(sweep(target, settings, PROMPTS, transport=httpx.MockTransport(handler)))
    assert len(seen) == 1 + 3 + 3 and all("lookup" not in b for b in seen)
    assert all(b["max_tokens"] == 20 for b in seen)  # the warm-up as long as the measured requests
    assert [(p["level"], p["mode"]) for p in passes] == [(1, "server"), (2, "server")]
    count_differences(passes, 1)
    s = passes[1]["summary"]
    assert (s["errors"], s["server"], s["acceptance_length"]) == (0, None, None)
    assert s["host_steal"] is None or 0 <= s["host_steal"] <= 1
    assert s["exactness"]["compared"] == 3 and s["exactness"]["differ"] == 0
    assert s["output_tokens"] == 6  # no usage: the events, one token each
    assert passes[0]["responses"][1]["text"] == "prompt 1 "


def test_a_started_server_gets_one_api_key_per_pass_and_per_warm_up():
    args = argparse.Namespace(concurrency=[1, 8], modes=["on", "off"], shared_namespace=False,
                              server_kind="auto")
    keys = pass_keys(args)
    assert list(keys) == ["warmup-on", "warmup-off", "1-on", "1-off", "8-off", "8-on"]
    assert len(set(keys.values())) == len(keys) and keys["8-on"] == "bench-8-on"
    settings = LoadSettings(levels=(1, 8), modes=("on", "off"))
    assert pass_labels(settings) == list(keys)
    assert pass_keys(argparse.Namespace(**{**vars(args), "shared_namespace": True})) == {}
    # treated as another server, the passes are `server` passes: their keys must be under those labels
    other = pass_keys(argparse.Namespace(**{**vars(args), "server_kind": "other"}))
    assert list(other) == ["warmup-server", "1-server", "8-server"]


def test_every_pass_sends_its_own_key_and_warm_ups_theirs():
    """The prefix cache is per namespace: a pass that carried an earlier pass's key would find that
    pass's prompts cached. Each request must carry its own pass's key, the warm-ups theirs."""
    seen: list[tuple[str | None, str]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=METRICS)
        body = json.loads(request.content)
        mode = "off" if body["lookup"] == {"enabled": False} else "on"
        seen.append((request.headers.get("authorization"), mode))
        events = [_chunk("a "), _chunk(finish="length")]
        return _sse_response(events)

    settings = LoadSettings(levels=(1, 2), modes=("on", "off"), max_tokens=4, warmup=2)
    keys = {label: f"key-{label}" for label in pass_labels(settings)}
    target = Target("http://ours", "m", True, {"Authorization": "Bearer client-wide"}, pass_keys=keys)
    asyncio.run(sweep(target, settings, PROMPTS, transport=httpx.MockTransport(handler)))
    expected = ([("Bearer key-warmup-on", "on")] * 2 + [("Bearer key-warmup-off", "off")] * 2
                + [("Bearer key-1-on", "on")] * 3 + [("Bearer key-1-off", "off")] * 3
                + [("Bearer key-2-off", "off")] * 3 + [("Bearer key-2-on", "on")] * 3)
    assert seen == expected
    seen.clear()  # without pass keys, the client's own header
    asyncio.run(sweep(Target("http://ours", "m", True, {"Authorization": "Bearer client-wide"}),
                      settings, PROMPTS, transport=httpx.MockTransport(handler)))
    assert {auth for auth, _ in seen} == {"Bearer client-wide"} and len(seen) == 16


def test_the_warm_up_holds_the_sets_longest_prompt():
    prompts = [BenchPrompt(f"p{i}", "k", ({"role": "user", "content": "x" * n},))
               for i, n in enumerate((5, 9, 3, 40, 7))]
    assert [p.id for p in warmup_prompts(prompts, 2)] == ["p0", "p3"]
    assert [p.id for p in warmup_prompts(prompts, 4)] == ["p0", "p1", "p2", "p3"]
    assert [p.id for p in warmup_prompts(prompts, 7)] == ["p0", "p1", "p2", "p3", "p4", "p0", "p1"]
    assert [p.id for p in warmup_prompts(prompts, 1)] == ["p3"]
    assert warmup_prompts(prompts, 0) == []


def test_the_warm_up_reaches_the_largest_level_by_default():
    """A pass that first reaches a number of sequences must not pay the server's growth to it (the KV
    pool's slots double as sequences arrive): by default each mode warms up with as many requests
    as the largest level, all in flight at once."""
    in_flight: Counter[str | None] = Counter()
    most: Counter[str | None] = Counter()
    seen: list[str | None] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=METRICS)
        key = request.headers.get("authorization")
        seen.append(key)
        in_flight[key] += 1
        most[key] = max(most[key], in_flight[key])
        await asyncio.sleep(0.01)  # every request of the warm-up is sent before any returns
        in_flight[key] -= 1
        events = [_chunk("a "), _chunk(finish="length")]
        return _sse_response(events)

    settings = LoadSettings(levels=(1, 5), modes=("on", "off"), max_tokens=4)
    assert settings.warmup_requests == 5
    assert LoadSettings(levels=(1, 5), modes=("on",), warmup=2).warmup_requests == 2
    keys = {label: f"key-{label}" for label in pass_labels(settings)}
    target = Target("http://ours", "m", True, {}, pass_keys=keys)
    asyncio.run(sweep(target, settings, PROMPTS, transport=httpx.MockTransport(handler)))
    assert seen.count("Bearer key-warmup-on") == 5 and seen.count("Bearer key-warmup-off") == 5
    assert seen[:5] == ["Bearer key-warmup-on"] * 5
    assert most["Bearer key-warmup-on"] == most["Bearer key-warmup-off"] == 5


def test_a_started_server_imports_this_lookupspec_whatever_the_working_directory_holds(tmp_path):
    """Run from a folder holding another ``lookupspec/``, `python -m` would import that one: the child
    server must run this interpreter's package."""
    import lookupspec
    from lookupspec.benchmarks.server_process import child_python

    decoy = tmp_path / "lookupspec"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("")
    env = dict(os.environ)
    probe = "import lookupspec; print(lookupspec.__file__)"
    naive = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                           text=True, check=True)
    assert naive.stdout.strip() == str(decoy / "__init__.py")  # the trap
    out = subprocess.run([*child_python(), "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == str(lookupspec.__file__)


# --------------------------------------------------------------------------------------- short prompts


def test_the_short_prompt_set_has_twelve_prompts_of_each_kind_interleaved():
    prompts = load_prompts(PROMPT_SETS["short"])
    assert len(prompts) == 48
    assert Counter(p.kind for p in prompts) == dict.fromkeys(KINDS, 12)
    assert [p.kind for p in prompts[:4]] == list(KINDS)
    assert all(len(p.messages) == 1 and len(p.messages[0]["content"]) < 400 for p in prompts)


@pytest.mark.real_model
def test_every_short_prompt_is_under_100_tokens_with_its_chat_template(real_model_dir):
    from lookupspec.models import load_tokenizer, render_chat

    tok = load_tokenizer(real_model_dir)
    lengths = {p.id: len(render_chat(tok, p.messages)) for p in load_prompts(PROMPT_SETS["short"])}
    assert max(lengths.values()) < 100, lengths


# -------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_bench_serve_starts_a_server_and_measures_both_modes_at_each_level(tiny_models, tmp_path):
    out = tmp_path / "serve.json"
    # the longest prompt last: a warm-up of the first prompt alone left the KV pool's growth to it
    # (from the server's 256 positions a slot) inside the first pass
    texts = ["Say hello.", "Name a colour.", " ".join(f"line {i}: the quick brown fox." for i in range(60))]
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"id": f"p{i}", "kind": "k", "messages": [{"role": "user", "content": t}]}
            for i, t in enumerate(texts)]
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    proc = subprocess.run(
        [sys.executable, "-m", "lookupspec.cli", "bench-serve", "--model", str(tiny_models["tiny-llama"]),
         "--prompts", str(prompts), "--concurrency", "1,2", "--max-tokens", "8", "--warmup", "1",
         "--threads", "1",
         "--json", str(out), "--plot", str(tmp_path / "serve.png")],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "**speculation on vs off**" in proc.stdout
    result = json.loads(out.read_text())
    assert {"date", "cpu", "logical_cores", "torch"} <= set(result["machine"])
    server = result["server"]
    assert server["kind"] == "lookupspec" and server["started_here"] and server["exit_status"] == 0
    assert "--max-batch" in server["command"] and (tmp_path / "serve.server.log").is_file()
    order = [(s["level"], s["mode"]) for s in result["summary"]]
    assert order == [(1, "on"), (1, "off"), (2, "off"), (2, "on")]
    assert result["settings"]["tokenizer_counts_events"] and set(result["rules"]) >= {"itl", "exactness"}
    assert result["settings"]["namespaces"] == "per-pass" and "a namespace per pass" in proc.stdout
    for p in result["passes"]:
        s = p["summary"]
        assert (s["requests"], s["errors"]) == (3, 0)
        assert s["output_tokens"] == sum(r["completion_tokens"] for r in p["responses"]) > 0
        assert s["server"]["decode_tokens"] > 0 and s["server"]["decode_tokens_per_s"] > 0
        # a namespace per pass: nothing an earlier pass (or the warm-up) cached is found; in one
        # namespace every pass after the first found ~99% of its prompt tokens cached
        assert s["server"]["prefix_hit_tokens"] == 0 and s["server"]["prefill_tokens"] > 0
        assert s["ttft_p50_s"] > 0 and s["itl_p50_s"] is not None
        assert s["busy_tokens_per_s"] > 0  # 3 requests on 1-2 streams: the last is sent after a response
        assert all(r["text"] and r["chunk_s"] and r["speculation"]["steps"] for r in p["responses"])
        if p["mode"] == "off":
            assert s["acceptance_length"] == 1.0  # plain decoding: one token per step
        if p["level"] == 1:  # the warm-up held the longest prompt: one stream never grows the KV pool
            assert s["server"]["kv_cache_resizes"] == 0, s["server"]
        if p["level"] == 2:  # greedy: the same texts as one stream at a time
            assert s["exactness"] == {"reference_level": 1, "compared": 3, "differ": 0, "differ_ids": []}
        if p["mode"] == "on":
            assert s["on_vs_off"]["compared"] == 3 and s["on_vs_off"]["differ"] == 0
    assert (tmp_path / "serve.png").stat().st_size > 0
