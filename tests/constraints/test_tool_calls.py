"""Reading tool calls out of an output: the constrained JSON object, Hermes/Qwen <tool_call> blocks,
Llama 3.1's JSON object; the call schema; which templates take tools."""

from __future__ import annotations

import json

from lookupspec.service.tools import ToolPlan, call_schema, parse_calls, template_syntax

TOOLS = [
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "g"}},
]


def test_constrained_output_is_one_call_and_an_unfinished_one_is_content() -> None:
    content, calls = parse_calls('{"name": "f", "arguments": {"x": 1}}', ToolPlan("json", ("f", "g")))
    assert content is None and calls[0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert parse_calls('{"name": "f", "argu', ToolPlan("json", ("f",))) == ('{"name": "f", "argu', [])


def test_hermes_blocks_and_llama3_json() -> None:
    text = (
        'Sure.<tool_call>\n{"name": "g", "arguments": {"a": "b"}}\n</tool_call>'
        '<tool_call>{"name": "zzz"}</tool_call>'
    )
    content, calls = parse_calls(text, ToolPlan("hermes", ("f", "g")))
    assert [c["function"]["name"] for c in calls] == ["g"] and content.startswith("Sure.")
    assert parse_calls("no call here", ToolPlan("hermes", ("f",))) == ("no call here", [])
    content, calls = parse_calls(
        '<|python_tag|>{"name": "f", "parameters": {"q": 2}}', ToolPlan("llama3", ("f",))
    )
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"q": 2}
    assert parse_calls('{"name": "other"}', ToolPlan("llama3", ("f",))) == ('{"name": "other"}', [])


def test_call_schema_names_one_tool_or_any() -> None:
    one = call_schema(TOOLS, "f")
    assert one["properties"]["name"] == {"const": "f"} and one["required"] == ["name", "arguments"]
    assert [s["properties"]["name"]["const"] for s in call_schema(TOOLS)["anyOf"]] == ["f", "g"]
    assert call_schema(TOOLS, "g")["properties"]["arguments"] == {"type": "object", "properties": {}}


def test_template_syntax() -> None:
    assert template_syntax(None) is None and template_syntax("{{ messages }}") is None
    assert template_syntax("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert template_syntax("{% if tools %}{{ tools | tojson }}{% endif %}") == "llama3"
