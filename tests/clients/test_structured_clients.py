"""Structured outputs and tools through the in-process client, the gateway client and the LangChain
wrapper (real langchain-core), in-process and against a real server: the same options, the same
outputs, parsed into the caller's types."""

from __future__ import annotations

import json

import pydantic
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from lookupspec.client import GenerationRequest, Lookup, connect
from lookupspec.integrations.langchain import ChatLookupspec

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Extract: Ada, 36."}]


class Person(pydantic.BaseModel):
    """A person."""

    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=6)
    age: int = pydantic.Field(ge=0, le=120)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module", params=["local", "gateway"])
def client(request, local_client, tiny_gateway):
    if request.param == "local":
        yield local_client
        return
    remote = connect(tiny_gateway.url)
    yield remote
    remote.close()


def test_json_schema_and_named_tool_through_either_client_equal_each_other(local_client, tiny_gateway):
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "p", "strict": True, "schema": Person.model_json_schema()},
    }
    req = GenerationRequest(messages=MESSAGES, max_tokens=60, response_format=fmt, logprobs=2, temperature=0)
    with connect(tiny_gateway.url) as remote:  # closed also when an assertion fails
        _check_both(local_client, remote, req, fmt)


def _check_both(local_client, remote, req, fmt) -> None:
    a, b = local_client.complete(req), remote.complete(req)
    assert a.text == b.text and a.finish_reason == b.finish_reason == "stop"
    Person.model_validate_json(a.text)
    off = local_client.complete(
        GenerationRequest(messages=MESSAGES, max_tokens=60, response_format=fmt, lookup=Lookup(enabled=False),
                          temperature=0)
    )
    assert off.text == a.text
    tool = GenerationRequest(
        messages=MESSAGES,
        max_tokens=60,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
    )
    for c in (local_client, remote):
        r = c.complete(tool)
        assert r.finish_reason == "tool_calls" and r.tool_calls[0]["function"]["name"] == "get_weather"
        assert json.loads(r.tool_calls[0]["function"]["arguments"])["city"] in ("Paris", "Oslo")


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(client, method):
    chat = ChatLookupspec(client=client, max_tokens=60)
    person = chat.with_structured_output(Person, method=method).invoke("Extract: Ada, 36.")
    assert isinstance(person, Person) and 0 <= person.age <= 120


def test_langchain_bind_tools_and_tool_messages(client):
    chat = ChatLookupspec(client=client, max_tokens=60)
    msg = chat.bind_tools([WEATHER], tool_choice="get_weather").invoke("Weather in Oslo?")
    assert isinstance(msg, AIMessage) and msg.tool_calls[0]["name"] == "get_weather"
    assert msg.tool_calls[0]["args"]["city"] in ("Paris", "Oslo")
    history = [
        HumanMessage("Weather in Oslo?"),
        msg,
        ToolMessage("sunny", tool_call_id=msg.tool_calls[0]["id"]),
    ]
    answer = chat.invoke(history, max_tokens=6)
    assert isinstance(answer.content, str) and not answer.tool_calls
