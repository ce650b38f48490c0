"""A validated request body -> the service's ``JobRequest``, planned by ``lookupspec.service.planning``
(the one planning path the in-process client takes too)."""

from __future__ import annotations

from typing import Any

from lookupspec.service.errors import bad_request
from lookupspec.service.jobs import GenerationJob
from lookupspec.service.planning import JobRequest, Lookup, plan
from lookupspec.service.service import Service

from .protocol import ChatCompletionRequest, CompletionRequest, LookupOptions

__all__ = ["plan_chat", "plan_completion"]


def _lookup(options: LookupOptions | None) -> Lookup:
    if options is None:
        return Lookup()
    return Lookup(enabled=options.enabled, collections=tuple(options.collections),
                  documents=tuple(options.documents), max_draft_tokens=options.max_draft_tokens,
                  sources=None if options.sources is None else tuple(options.sources))


def _messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    out = []
    for m in req.messages:
        # content parts: only text parts exist for this model
        content = "".join(part.text for part in m.content) if isinstance(m.content, list) else m.content or ""
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": content}
        extra = m.model_extra or {}
        for key in ("tool_calls", "tool_call_id"):  # an assistant's calls, a tool result's call id
            if extra.get(key) is not None:
                msg[key] = extra[key]
        if m.name is not None and m.role == "tool":
            msg["name"] = m.name
        out.append(msg)
    return out


def _structured(req: CompletionRequest | ChatCompletionRequest) -> dict[str, Any]:
    """The JobRequest fields of structured outputs, tools, log-probabilities and penalties."""
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs and not req.logprobs:  # 0 is the neutral value clients send
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        tools = None if req.tools is None else [t.model_dump(exclude_none=True) for t in req.tools]
        choice = req.tool_choice
        tool_choice = choice.model_dump() if choice is not None and not isinstance(choice, str) else choice
    else:
        logprobs, tools, tool_choice = req.logprobs, None, None
    rf = None
    if req.response_format is not None:
        rf = req.response_format.model_dump(by_alias=True, exclude_none=True)
    return {"response_format": rf, "tools": tools, "tool_choice": tool_choice, "logprobs": logprobs,
            "frequency_penalty": req.frequency_penalty, "presence_penalty": req.presence_penalty,
            "repetition_penalty": req.repetition_penalty, "logit_bias": req.logit_bias,
            "min_tokens": req.min_tokens}


def plan_completion(service: Service, req: CompletionRequest, namespace: str,
                    arrived: float | None = None) -> GenerationJob:
    job = JobRequest(prompt=req.prompt, max_tokens=req.max_tokens, n=req.n, temperature=req.temperature,
                     top_p=req.top_p, top_k=req.top_k, seed=req.seed, stop=req.stop,
                     lookup=_lookup(req.lookup), **_structured(req))
    return plan(service, job, namespace, arrived)


def plan_chat(service: Service, req: ChatCompletionRequest, namespace: str,
              arrived: float | None = None) -> GenerationJob:
    use_new = req.max_completion_tokens is not None
    job = JobRequest(messages=_messages(req),
                     max_tokens=req.max_completion_tokens if use_new else req.max_tokens,
                     max_tokens_field="max_completion_tokens" if use_new else "max_tokens",
                     n=req.n, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=req.seed,
                     stop=req.stop, lookup=_lookup(req.lookup), **_structured(req))
    return plan(service, job, namespace, arrived)
