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


# ------------------------------------------------------------------------------ streamed arguments


def _stream(pieces: list[str]) -> tuple[list[list[dict]], list[dict], bool]:
    from lookupspec.service.tool_stream import CallStream

    s = CallStream()
    fed = [s.feed(p) for p in pieces]
    tail, complete = s.finish()
    return fed, tail, complete


def test_a_constrained_call_streams_its_header_then_argument_fragments() -> None:
    fed, tail, complete = _stream(['{"name": "f", "arg', 'uments": {"city": "Os', 'lo", "n": [1, ', '2]}}'])
    assert fed[0] == []  # the arguments' key is not complete yet
    head, first = fed[1]
    assert head["index"] == 0 and head["id"].startswith("call_") and head["type"] == "function"
    assert head["function"] == {"name": "f", "arguments": ""}
    assert first == {"index": 0, "function": {"arguments": '{"city": "Os'}}
    assert fed[2] == [{"index": 0, "function": {"arguments": 'lo", "n": [1, '}}]
    assert fed[3] == [{"index": 0, "function": {"arguments": "2]}"}}]  # the call's own "}" is not sent
    assert tail == [] and complete


def test_streamed_fragments_join_to_the_non_streamed_arguments_character_by_character() -> None:
    arguments = '{"q": "a \\"}\\" {[", "x": {"y": [1, {"z": null}]}, "e": 1.50}'
    text = '{"name": "get_weather", "arguments": ' + arguments + "}"
    fed, tail, complete = _stream(list(text))
    deltas = [d for ds in fed for d in ds] + tail
    assert complete and deltas[0]["function"]["name"] == "get_weather"
    joined = "".join(d["function"]["arguments"] for d in deltas)
    _, calls = parse_calls(text, ToolPlan("json", ("get_weather",)))
    assert joined == calls[0]["function"]["arguments"] == arguments
    assert sum(bool(d["function"]["arguments"]) for d in deltas) > 1


def test_a_scalar_argument_is_sent_whole_at_the_end_and_a_cut_call_is_not_complete() -> None:
    fed, tail, complete = _stream(['{"name": "f", "arguments": 12', '.5}'])
    assert [d["function"].get("name") for d in fed[0]] == ["f"] and fed[1] == []
    assert tail == [{"index": 0, "function": {"arguments": "12.5"}}] and complete
    fed, tail, complete = _stream(['{"name": "f", "arguments": {"a": "b', 'c'])
    assert "".join(d["function"]["arguments"] for ds in fed for d in ds) == '{"a": "bc' and not complete
    fed, tail, complete = _stream(['{"name": "f"'])
    assert fed == [[]] and not complete
