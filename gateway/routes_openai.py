"""OpenAI-compatible routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``.

Thin: validate (pydantic), plan on a thread-pool thread (``planning``), queue (``Service.submit``:
429 when full), then answer with one JSON body or an SSE stream (``streaming``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from lookupspec.service.accounting import speculation, usage
from lookupspec.service.service import Service

from .errors import not_found
from .planning import plan_chat, plan_completion
from .protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from .routing import ERRORS, namespace, service_of
from .streaming import Kind, chat_logprobs, collect, completion_logprobs, new_id, sse_events, tool_output
from .unknown_fields import UnknownFields

__all__ = ["router"]

router = APIRouter()

# With stream=true: Server-Sent Events, each event's data a JSON chunk (CompletionChunk / ChatChunk, or
# {"error": ...}), then "[DONE]". Described per event, as SSE-aware tools validate it.
_STREAM = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"], "properties": {"data": {"type": "string"}},
    "description": "one SSE event: data is a JSON CompletionChunk / ChatChunk or {\"error\": ...}, "
                   "and the last event's data is [DONE]"}}}
_GEN_ERRORS = ERRORS(400, 401, 404, 413, 429, 503, 504)
UNKNOWN_FIELDS = UnknownFields()  # process-wide, bounded


def _model_card(service: Service) -> dict[str, Any]:
    return ModelCard(id=service.config.model_name, created=int(service.started_at),
                     max_model_len=service.context_window).model_dump()


@router.get("/v1/models", response_model=ModelList, responses=ERRORS(401))
async def list_models(request: Request, _: Annotated[str, Depends(namespace)]) -> Any:
    return {"object": "list", "data": [_model_card(service_of(request))]}


@router.get("/v1/models/{model:path}", response_model=ModelCard, responses=ERRORS(401, 404))
async def get_model(request: Request, model: Annotated[str, Path()],
                    _: Annotated[str, Depends(namespace)]) -> Any:
    service = service_of(request)
    if model != service.config.model_name:
        raise not_found(f"the model {model!r} does not exist", "model", "model_not_found")
    return _model_card(service)


async def _generate(request: Request, body: CompletionRequest | ChatCompletionRequest, ns: str,
                    kind: Kind) -> Any:
    arrived = time.perf_counter()
    service = service_of(request)
    UNKNOWN_FIELDS.observe((body.model_extra or {}).keys())
    if body.model != service.config.model_name:
        raise not_found(f"the model {body.model!r} does not exist; this server serves "
                        f"{service.config.model_name!r}", "model", "model_not_found")
    if isinstance(body, ChatCompletionRequest):
        job = await run_in_threadpool(plan_chat, service, body, ns, arrived)
    else:
        job = await run_in_threadpool(plan_completion, service, body, ns, arrived)
    ticket = service.submit(job, asyncio.get_running_loop())
    model = service.config.model_name
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(sse_events(ticket, kind, model, include_usage),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    done = await collect(request, ticket)
    choices = []
    for index in sorted(done.finished):
        text = "".join(done.texts.get(index, ()))
        finish = done.finished[index].finish_reason
        entries = done.logprobs.get(index)
        if kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if job.tools is not None:
                content, calls = tool_output(text, job.tools)
                message = {"role": "assistant", "content": content}
                if calls:
                    message["tool_calls"] = calls
                    finish = "tool_calls"
            choices.append({"index": index, "message": message,
                            "logprobs": None if entries is None else chat_logprobs(entries),
                            "finish_reason": finish})
        else:
            choices.append({"index": index, "text": text,
                            "logprobs": None if entries is None else completion_logprobs(entries),
                            "finish_reason": finish})
    finished = list(done.finished.values())
    return JSONResponse({
        "id": new_id(kind),
        "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(job.prompt_tokens, finished),
        "speculation": speculation([f.stats for f in finished]),
    })


@router.post("/v1/completions", response_model=CompletionResponse,
             responses={**_GEN_ERRORS, 200: {"content": _STREAM}})
async def completions(request: Request, body: CompletionRequest,
                      ns: Annotated[str, Depends(namespace)]) -> Any:
    """Text completion (OpenAI's legacy endpoint), plus the ``lookup`` extension."""
    return await _generate(request, body, ns, "completion")


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse,
             responses={**_GEN_ERRORS, 200: {"content": _STREAM}})
async def chat_completions(request: Request, body: ChatCompletionRequest,
                           ns: Annotated[str, Depends(namespace)]) -> Any:
    """Chat completion, plus the ``lookup`` extension."""
    return await _generate(request, body, ns, "chat")
