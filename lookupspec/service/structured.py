"""A request's structured-output, tool, log-probability and penalty options -> ``LogitsParams``.

Both front ends plan through here (``planning``): the OpenAI fields as the gateway validated them,
or the in-process client's equivalents. Every problem is a 400 naming the parameter: a schema the
grammar library cannot compile (``response_format`` / ``tools``), a tool without a name,
``top_logprobs`` without ``logprobs``, a token id outside the vocabulary in ``logit_bias``, a penalty
out of range. Schemas are compiled here, off the event loop, and cached per tokenizer.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lookupspec.constraints import GrammarCompiler, GrammarError, GrammarSpec
from lookupspec.logits import LogitsParams

from .errors import ServiceError, bad_request
from .tools import ToolPlan, call_schema, render_tool_messages, template_syntax

if TYPE_CHECKING:
    from .planning import JobRequest
    from .service import Service

__all__ = ["chat_text", "compiler", "logits_params", "param_of"]

_LOCK = threading.Lock()


def compiler(service: Service) -> GrammarCompiler:
    """The service's grammar compiler (built on first use: it reads the whole vocabulary)."""
    te = service.text_engine
    with _LOCK:
        comp = getattr(te, "_grammar_compiler", None)
        if comp is None:
            comp = GrammarCompiler(te.tokenizer, service.engine.vocab_size, te.eos_token_ids)
            te._grammar_compiler = comp
    return comp


def param_of(message: str) -> str | None:
    """The request parameter a ``LogitsParams`` ValueError names ("frequency_penalty must be ...")."""
    name = message.split(" ", 1)[0]
    known = {"frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "min_tokens",
             "top_logprobs"}
    return name if name in known else None


def _tool_choice(req: JobRequest) -> tuple[str, str | None]:
    """(mode, function name): mode none / auto / required / named."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return "none", None
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise bad_request('tool_choice must be "none", "auto", "required" or a named function',
                              "tool_choice")
        return choice, None
    name = (choice.get("function") or {}).get("name") if isinstance(choice, Mapping) else None
    if not name:
        raise bad_request("a named tool_choice needs function.name", "tool_choice")
    return "named", str(name)


def _check_tools(req: JobRequest) -> list[Mapping[str, Any]]:
    tools = list(req.tools or ())
    names = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(fn, Mapping) or not fn.get("name"):
            raise bad_request(f"tools[{i}] has no function name", f"tools[{i}].function.name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, Mapping):
            raise bad_request(f"tools[{i}].function.parameters must be a JSON schema object",
                              f"tools[{i}].function.parameters")
        names.append(str(fn["name"]))
    if len(set(names)) != len(names):
        raise bad_request("tool names must be unique", "tools")
    return tools


def _compile(service: Service, spec: GrammarSpec, param: str) -> Any:
    try:
        return compiler(service).compile(spec)
    except GrammarError as exc:
        raise bad_request(str(exc), param, code="invalid_schema") from None


def _grammar(service: Service, req: JobRequest) -> tuple[Any, ToolPlan | None]:
    mode, name = _tool_choice(req)
    tools = _check_tools(req)
    if mode in ("required", "named"):
        if req.response_format and req.response_format.get("type", "text") != "text":
            raise bad_request("response_format and a required tool call cannot both constrain the output",
                              "response_format")
        try:
            schema = call_schema(tools, name)
        except KeyError:
            raise bad_request(f"tool_choice names {name!r}, which is not among the tools",
                              "tool_choice") from None
        grammar = _compile(service, GrammarSpec.json_schema(schema, strict=True), "tools")
        names = tuple(str(t["function"]["name"]) for t in tools)
        return grammar, ToolPlan("json", names)
    plan = None
    if mode == "auto":
        syntax = template_syntax(getattr(service.text_engine.tokenizer, "chat_template", None))
        if syntax is None:
            raise bad_request('this model\'s chat template takes no tools, so tool_choice "auto" cannot '
                              'offer them; use tool_choice "required" or a named function', "tool_choice")
        plan = ToolPlan(syntax, tuple(str(t["function"]["name"]) for t in tools))
    rf = req.response_format
    if not rf or rf.get("type", "text") == "text":
        return None, plan
    kind = rf.get("type")
    if kind == "json_object":
        return _compile(service, GrammarSpec.json_object(), "response_format"), plan
    if kind != "json_schema":
        raise bad_request(f"response_format.type must be text, json_object or json_schema, got {kind!r}",
                          "response_format.type")
    js_field = rf.get("json_schema")
    js: Mapping[str, Any] = js_field if isinstance(js_field, Mapping) else {}
    user_schema = js.get("schema")
    if not isinstance(user_schema, Mapping):
        raise bad_request("response_format json_schema needs json_schema.schema (a JSON schema object)",
                          "response_format.json_schema.schema")
    try:
        spec = GrammarSpec.json_schema(dict(user_schema), strict=bool(js.get("strict")))
    except GrammarError as exc:
        raise bad_request(str(exc), "response_format.json_schema.schema", code="invalid_schema") from None
    return _compile(service, spec, "response_format.json_schema.schema"), plan


def logits_params(service: Service, req: JobRequest) -> tuple[LogitsParams | None, ToolPlan | None]:
    """The request's logits processing (None: none asked for) and how its output is read as tool
    calls (None: it is not). Raises a 400 ``ServiceError`` naming the parameter."""
    grammar, tools = _grammar(service, req)
    bias: list[tuple[int, float]] = []
    vocab = service.engine.vocab_size
    for key, value in (req.logit_bias or {}).items():
        try:
            tok = int(key)
        except (TypeError, ValueError):
            raise bad_request(f"logit_bias keys must be token ids, got {key!r}", "logit_bias") from None
        if not 0 <= tok < vocab:
            raise bad_request(f"logit_bias token id {tok} is outside the vocabulary [0, {vocab})",
                              "logit_bias")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad_request(f"logit_bias values must be numbers, got {value!r} for {key}", "logit_bias")
        bias.append((tok, float(value)))
    try:
        params = LogitsParams(
            frequency_penalty=req.frequency_penalty or 0.0, presence_penalty=req.presence_penalty or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            logit_bias=tuple(bias), min_tokens=req.min_tokens or 0, logprobs=req.logprobs, grammar=grammar)
    except ValueError as exc:
        raise bad_request(str(exc), param_of(str(exc))) from None
    if not params.rewrites and params.logprobs is None:
        return None, tools
    return params, tools


def chat_text(service: Service, req: JobRequest) -> str:
    """The chat prompt: the messages through the model's chat template, with the tools when the
    request offers them (through the template where it takes tools, else in a system message)."""
    assert req.messages is not None
    te = service.text_engine
    messages = [dict(m) for m in req.messages]
    mode, _ = _tool_choice(req)
    if mode == "none":
        plain = [{**m, "content": m.get("content") or ""} for m in messages]
        return te.chat_text(plain)
    tools = _check_tools(req)
    tok = te.tokenizer
    if template_syntax(getattr(tok, "chat_template", None)) is not None:
        try:
            return str(tok.apply_chat_template(messages, tools=[dict(t) for t in tools],
                                               add_generation_prompt=True, tokenize=False))
        except Exception as exc:
            raise ServiceError(400, f"cannot render the messages and tools with the model's chat template: "
                                    f"{exc}", param="messages", code="invalid_value") from None
    return te.chat_text(render_tool_messages(messages, tools, constrained=True))
