"""Structured outputs, tools, log-probabilities and penalties over HTTP, with the real `openai` client
against a real `lookupspec serve` (tiny model): outputs parse and validate, equal the in-process
engine's under the same constraint, and are the same with speculation on and off; bad input is a 400
naming the parameter; a grammar dead end fails its request alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

import httpx
import openai
import pydantic
import pytest
from gateway_harness import KEY_ALPHA, MODEL, Gateway

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Extract the record: Ada, 36, engineer, London."}]


class Role(StrEnum):
    engineer = "engineer"
    artist = "artist"


class Person(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=6)
    age: int = pydantic.Field(ge=0, le=120)
    role: Role
    tags: list[bool] = pydantic.Field(max_length=2)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Paris", "Oslo"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Gateway]:
    g = Gateway(
        tiny_model,
        tmp_path_factory.mktemp("structured"),
        name="structured",
        args=["--api-key", f"{KEY_ALPHA}:alpha"],
    )
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


def _both(oai: openai.OpenAI, **kwargs):
    """The same request with speculation off and on (lookup drafts from the inline document); greedy
    unless the test says otherwise (the server's default temperature is OpenAI's 1.0, unseeded)."""
    kwargs.setdefault("temperature", 0.0)
    off = oai.chat.completions.create(model=MODEL, extra_body={"lookup": {"enabled": False}}, **kwargs)
    on = oai.chat.completions.create(
        model=MODEL,
        extra_body={
            "lookup": {"documents": ['{"name": "Ada", "age": 36, "role": "engineer", "tags": [true, false]}']}
        },
        **kwargs,
    )
    return off, on


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (0.8, 7)], ids=["greedy", "seeded"])
def test_pydantic_response_format_parses_validates_and_matches_speculation_off(oai, temperature, seed):
    kwargs = {"messages": MESSAGES, "max_tokens": 80, "temperature": temperature, "seed": seed}
    off = oai.chat.completions.parse(
        model=MODEL, response_format=Person, extra_body={"lookup": {"enabled": False}}, **kwargs
    )
    on = oai.chat.completions.parse(model=MODEL, response_format=Person, **kwargs)
    assert off.choices[0].message.content == on.choices[0].message.content
    assert off.choices[0].finish_reason == "stop"
    person = on.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120 and len(person.name) <= 6


def test_json_object_on_both_endpoints(oai, alpha):
    off, on = _both(oai, messages=MESSAGES, max_tokens=60, response_format={"type": "json_object"})
    assert off.choices[0].message.content == on.choices[0].message.content
    if off.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(off.choices[0].message.content), dict)
    r = alpha.post(
        "/v1/completions",
        json={
            "model": MODEL,
            "prompt": "JSON:",
            "max_tokens": 120,
            "temperature": 0.0,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "p", "strict": True, "schema": Person.model_json_schema()},
            },
        },
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    Person.model_validate_json(choice["text"])


def test_named_tool_call_and_its_streamed_deltas(oai):
    kwargs = {
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "max_tokens": 60,
        "tools": [WEATHER, CLOCK],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    off, on = _both(oai, **kwargs)
    for r in (off, on):
        assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
        (call,) = r.choices[0].message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
        args = json.loads(call.function.arguments)
        assert args["city"] in ("Paris", "Oslo") and 1 <= args["days"] <= 7
    assert (
        off.choices[0].message.tool_calls[0].function.arguments
        == on.choices[0].message.tool_calls[0].function.arguments
    )
    stream = oai.chat.completions.create(model=MODEL, stream=True, temperature=0.0, **kwargs)
    name, arguments, finish, ids = "", "", None, set()
    for chunk in stream:
        for c in chunk.choices:
            for tc in c.delta.tool_calls or ():
                assert tc.index == 0
                ids.add(tc.id)
                name += tc.function.name or ""
                arguments += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert finish == "tool_calls" and name == "get_weather" and len(ids - {None}) == 1
    assert json.loads(arguments) == json.loads(on.choices[0].message.tool_calls[0].function.arguments)


@pytest.mark.parametrize("lookup", [{"enabled": False}, {"enabled": True}], ids=["off", "on"])
def test_a_constrained_call_streams_its_arguments_as_they_are_generated(oai, lookup):
    """OpenAI's incremental shape: a first delta with index, id, type, name and empty arguments, then
    argument fragments (several), then finish_reason tool_calls; joined, they are exactly the
    arguments of the same request not streamed."""
    kwargs = {"messages": [{"role": "user", "content": "Weather in Oslo for three days?"}], "max_tokens": 60,
              "temperature": 0.0, "tools": [WEATHER, CLOCK], "tool_choice": "required",
              "extra_body": {"lookup": lookup}}
    whole = oai.chat.completions.create(model=MODEL, **kwargs).choices[0].message.tool_calls[0]
    deltas, finish = [], None
    for chunk in oai.chat.completions.create(model=MODEL, stream=True, **kwargs):
        for c in chunk.choices:
            deltas += list(c.delta.tool_calls or ())
            finish = c.finish_reason or finish
    first, rest = deltas[0], deltas[1:]
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name == whole.function.name and first.function.arguments == ""
    assert all(d.index == 0 and d.id is None and not d.function.name for d in rest)
    fragments = [d.function.arguments for d in rest]
    assert len(fragments) > 1 and all(fragments)
    assert "".join(fragments) == whole.function.arguments and finish == "tool_calls"
    json.loads(whole.function.arguments)


def test_required_tool_choice_and_tool_messages_in_the_conversation(oai):
    first = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Time?"}],
        max_tokens=60,
        temperature=0.0,
        tools=[WEATHER, CLOCK],
        tool_choice="required",
    )
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name in ("get_weather", "get_time")
    follow = oai.chat.completions.create(
        model=MODEL,
        max_tokens=8,
        tools=[WEATHER, CLOCK],
        tool_choice="none",
        messages=[
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "12:00"},
        ],
    )
    assert (
        follow.choices[0].finish_reason in ("stop", "length") and follow.choices[0].message.tool_calls is None
    )


def test_logprobs_chat_and_completions_streamed_and_not(oai):
    kwargs = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 12,
        "logprobs": True,
        "top_logprobs": 3,
        "temperature": 0.0,
    }
    r = oai.chat.completions.create(**kwargs)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens  # one entry per token (a token may be part of a
    # character: its text alone is then a replacement character, as with OpenAI's byte-level tokens)
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].logprob >= t.logprob - 1e-6
    off = oai.chat.completions.create(extra_body={"lookup": {"enabled": False}}, **kwargs)
    for a, b in zip(content, off.choices[0].logprobs.content, strict=True):  # tolerance: see docs
        assert a.token == b.token and abs(a.logprob - b.logprob) <= 1e-4
    streamed = [
        t
        for chunk in oai.chat.completions.create(stream=True, **kwargs)
        for c in chunk.choices
        if c.logprobs
        for t in c.logprobs.content
    ]
    assert [t.token for t in streamed] == [t.token for t in content]
    c = oai.completions.create(model=MODEL, prompt="Once upon", max_tokens=8, logprobs=2, temperature=0.0)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == c.usage.completion_tokens == len(lp.token_logprobs)
    assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0


def test_penalties_bias_and_min_tokens_change_the_output_alike_with_speculation_on_and_off(oai):
    base = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0.0)
    kwargs = {
        "messages": MESSAGES,
        "max_tokens": 16,
        "frequency_penalty": 1.5,
        "presence_penalty": 0.5,
        "logit_bias": {"300": 5.0},
        "temperature": 0.0,
    }
    off = oai.chat.completions.create(
        model=MODEL,
        extra_body={"lookup": {"enabled": False}, "repetition_penalty": 1.2, "min_tokens": 10},
        **kwargs,
    )
    on = oai.chat.completions.create(
        model=MODEL, extra_body={"repetition_penalty": 1.2, "min_tokens": 10}, **kwargs
    )
    assert off.choices[0].message.content == on.choices[0].message.content
    assert off.choices[0].message.content != base.choices[0].message.content


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER], "tool_choice": "auto"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logit_bias": {"99999": 1}}, "logit_bias"),
        ({"min_tokens": 50, "max_tokens": 4}, "min_tokens"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "bogus"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_parameter(alpha, body, param):
    r = alpha.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 8, **body}
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_grammar_dead_end_fails_that_request_alone(alpha):
    schema = {
        "type": "object",
        "properties": {"a": {"enum": ["x"]}},
        "required": ["a"],
        "additionalProperties": False,
    }
    dead = alpha.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": MESSAGES,
            "max_tokens": 40,
            "min_tokens": 30,
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
        },
    )
    assert dead.status_code == 400 and dead.json()["error"]["code"] == "grammar_dead_end", dead.text
    ok = alpha.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 4})
    assert ok.status_code == 200
