"""From a ``JobRequest`` to a ``GenerationJob``: tokenize, check the context window, resolve the
``lookup`` options into ``SpecParams`` and a ``LookupScope``. Both front ends plan here: the gateway
turns its validated request bodies into a ``JobRequest`` (``gateway/planning.py``), the in-process
client its ``GenerationRequest``.

Everything that can be wrong with a request is found here, before it is queued, and raised as a
4xx ``ServiceError`` naming the offending ``param``; the worker only ever sees jobs the engine
accepts.
Cheap checks come first: the number of choices, then a byte bound that refuses a prompt text too
long to fit the window before it is tokenized (``lookupspec.prompt_bound``), then tokenizing, the
window, and the ``lookup`` options (``lookupspec.planning``, shared with the in-process client).
This runs on a thread-pool thread (tokenizing a long prompt, or indexing inline documents, is
blocking work), never on the event loop.

Choices: a request with P prompts and ``n`` gets P * n choices, choice ``p * n + j`` being the
j-th sample of prompt p (OpenAI's order). With a ``seed``, sample j uses ``seed + j``, so the n
samples differ but the whole response is reproducible and choice 0 equals an in-process
generation with the same seed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lookupspec.params import SpecParams
from lookupspec.planning import PlanError, UnknownCollection, plan_lookup
from lookupspec.requests import Lookup

from . import structured
from .errors import ServiceError, bad_request, too_large
from .jobs import ChoicePlan, GenerationJob
from .service import Service

__all__ = ["JobRequest", "Lookup", "plan"]

_SEED_MOD = 2**63


Prompt = str | Sequence[int] | Sequence[str] | Sequence[Sequence[int]]


@dataclass(frozen=True)
class JobRequest:
    """One generation request as either front end received it: ``prompt`` (a text, token ids, or a
    list of either: one choice group per prompt) or chat ``messages`` (``{"role", "content"}``).
    ``None`` means the default: ``max_tokens`` the rest of the window, ``temperature`` and ``top_p``
    1.0, ``top_k`` 0 (off), ``n`` 1. ``max_tokens_field`` names the field in errors."""

    prompt: Prompt | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    max_tokens: int | None = None
    max_tokens_field: str = "max_tokens"
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | Sequence[str] | None = None
    lookup: Lookup = field(default_factory=Lookup)
    # structured outputs, tools, log-probabilities, penalties (lookupspec.service.structured);
    # None: off / the default
    response_format: Mapping[str, Any] | None = None  # OpenAI's object: {"type": ..., "json_schema": ...}
    tools: Sequence[Mapping[str, Any]] | None = None  # OpenAI's tools: {"type": "function", "function"}
    tool_choice: str | Mapping[str, Any] | None = None
    logprobs: int | None = None  # alternatives per token (0 = the token's own only); None: none
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: Mapping[str, float] | None = None
    min_tokens: int | None = None


def _context_error(prompt_len: int, max_tokens: int | None, window: int, field: str) -> ServiceError:
    if max_tokens is None:
        return ServiceError(400, f"this model's maximum context length is {window} tokens; the prompt has "
                             f"{prompt_len} tokens, leaving no room for the completion",
                        param="input_tokens", code="context_length_exceeded")
    return ServiceError(400, f"this model's maximum context length is {window} tokens; the prompt has "
                         f"{prompt_len} tokens and {field} asks for {max_tokens} more "
                         f"(at most {window - prompt_len} fit)",
                    param=field, code="context_length_exceeded")


def _check_bytes(service: Service, text: str) -> None:
    """Refuse, before tokenizing, a prompt text too long to fit the window whatever its tokens
    (``lookupspec.prompt_bound``: no prompt that fits is refused)."""
    bound = service.text_engine.prompt_bound
    if bound is None:
        return
    window = service.context_window
    limit = bound.limit(window)
    if len(text) > limit and bound.countable_bytes(text) > limit:  # characters <= bytes: a cheap pre-test
        raise ServiceError(400, f"this model's maximum context length is {window} tokens; the prompt has "
                            f"more than {limit} bytes, more than {window - 1} tokens of at most "
                            f"{bound.bytes_per_token} bytes each can hold",
                       param="input_tokens", code="context_length_exceeded")


def _check_ids(ids: Sequence[int], vocab_size: int, param: str) -> tuple[int, ...]:
    if not ids:
        raise bad_request("the prompt must contain at least one token", param)
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})", param)
    return tuple(int(t) for t in ids)


def _encode_text(service: Service, text: str) -> list[int]:
    _check_bytes(service, text)
    return service.text_engine.encode_text(text, add_special_tokens=True)


def _lookup(service: Service, namespace: str, lk: Lookup) -> tuple[SpecParams, Any]:
    """The request's ``lookup`` options -> (SpecParams, LookupScope) by the one planning path the
    in-process client uses too (``lookupspec.planning``); the inline-document limits come first."""
    limits = service.config.limits
    if len(lk.documents) > limits.max_inline_documents:
        raise too_large(f"at most {limits.max_inline_documents} inline documents per request",
                        "lookup.documents")
    if sum(len(d.encode()) for d in lk.documents) > limits.max_inline_bytes:
        raise too_large(f"inline documents are limited to {limits.max_inline_bytes} bytes in all",
                        "lookup.documents")

    def collection(name: str) -> Any:
        # The store's state is the authority on existence; a collection whose documents were all
        # deleted exists but has no index here.
        if service.store.state.get_collection(namespace, name) is None:
            raise UnknownCollection(name)
        return service.indexes.corpus(namespace, name)

    base: SpecParams = getattr(service.engine, "default_spec", None) or SpecParams()
    try:
        plan = plan_lookup(base, enabled=lk.enabled, collections=lk.collections, documents=lk.documents,
                           max_draft_tokens=lk.max_draft_tokens, sources=lk.sources, collection=collection,
                           inline_corpus=service.text_engine.corpus_from_texts,
                           output=service.indexes.output(namespace))
    except PlanError as exc:
        raise ServiceError(exc.status, exc.message, param=exc.param, code=exc.code) from None
    return plan.spec, plan.scope


def _check_choices(service: Service, prompts: int, n: int) -> None:
    limit = service.config.limits.max_choices
    if prompts > limit:
        raise bad_request(f"{prompts} prompts exceed the limit of {limit} choices per request", "prompt")
    if prompts * n > limit:
        raise bad_request(f"{prompts} prompt(s) x n={n} exceeds the limit of {limit} choices per request",
                          "n")


def _sampling_param(message: str) -> str | None:
    name = message.split(" ", 1)[0]  # "top_p must be in (0, 1], got 0" -> "top_p"
    return name if name in {"max_tokens", "temperature", "top_k", "top_p", "seed"} else None


def _plan(service: Service, req: JobRequest, namespace: str, prompts: list[tuple[int, ...]],
          arrived: float) -> GenerationJob:
    max_tokens, max_field = req.max_tokens, req.max_tokens_field
    window = service.context_window
    n = req.n if req.n is not None else 1
    share = service.kv_slot_positions
    for ids in prompts:
        if len(ids) >= window:
            raise _context_error(len(ids), None, window, max_field)
        if share is not None and len(ids) >= share:
            raise ServiceError(400, f"the prompt has {len(ids)} tokens; this server's KV cache "
                                    f"(--kv-cache-mb) gives each sequence {share} positions, for the prompt "
                                    f"and at least one generated token", param="input_tokens",
                               code="context_length_exceeded")
        if max_tokens is not None and len(ids) + max_tokens > window:
            raise _context_error(len(ids), max_tokens, window, max_field)
    spec, scope = _lookup(service, namespace, req.lookup)  # after the cheap checks: it may index text
    logits, tools = structured.logits_params(service, req)
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    temperature = 1.0 if req.temperature is None else req.temperature
    top_p = 1.0 if req.top_p is None else req.top_p
    top_k = max(req.top_k or 0, 0)
    choices = []
    for p, ids in enumerate(prompts):
        budget = max_tokens if max_tokens is not None else window - len(ids)
        for j in range(n):
            seed = None if req.seed is None else (req.seed + j) % _SEED_MOD
            try:
                params = service.text_engine.params(max_tokens=budget, temperature=temperature,
                                                    top_p=top_p, top_k=top_k, seed=seed)
                if logits is not None:
                    params = dataclasses.replace(params, logits=logits)
            except ValueError as exc:
                param = _sampling_param(str(exc)) or structured.param_of(str(exc))
                raise bad_request(str(exc), param) from None
            choices.append(ChoicePlan(p * n + j, ids, params))
    timeout = service.config.request_timeout_s
    return GenerationJob(namespace, tuple(choices), sum(len(ids) for ids in prompts), stop, spec, scope,
                         arrived, arrived + timeout, tools)


def plan(service: Service, req: JobRequest, namespace: str, arrived: float | None = None) -> GenerationJob:
    """Validate ``req`` and turn it into a job (raises ``ServiceError``). Blocking work (tokenizing,
    indexing inline documents): run it off the event loop."""
    arrived = time.perf_counter() if arrived is None else arrived
    if req.messages is not None:
        return _plan_chat(service, req, namespace, arrived)
    if req.prompt is None:
        raise bad_request("pass a prompt or messages", "prompt")
    vocab = service.engine.vocab_size
    raw = req.prompt
    if not isinstance(raw, str) and not raw:
        raise bad_request("the prompt must not be empty", "prompt")
    single = isinstance(raw, str) or all(isinstance(x, int) for x in raw)
    # before tokenizing: every prompt costs CPU
    _check_choices(service, 1 if single else len(raw), req.n if req.n is not None else 1)
    if isinstance(raw, str):
        prompts = [_check_ids(_encode_text(service, raw), vocab, "prompt")]
    elif single:
        prompts = [_check_ids(raw, vocab, "prompt")]  # type: ignore[arg-type]
    elif all(isinstance(x, str) for x in raw):
        prompts = [_check_ids(_encode_text(service, x), vocab, f"prompt[{i}]")  # type: ignore[arg-type]
                   for i, x in enumerate(raw)]
    else:
        prompts = [_check_ids(x, vocab, f"prompt[{i}]") for i, x in enumerate(raw)]  # type: ignore[arg-type]
    return _plan(service, req, namespace, prompts, arrived)


def _plan_chat(service: Service, req: JobRequest, namespace: str, arrived: float) -> GenerationJob:
    assert req.messages is not None
    _check_choices(service, 1, req.n if req.n is not None else 1)
    try:
        text = structured.chat_text(service, req)
    except ServiceError:
        raise
    except Exception as exc:  # no chat template, or the template rejects these messages
        raise bad_request(f"cannot render the messages with the model's chat template: {exc}",
                          "messages") from None
    _check_bytes(service, text)
    ids = service.text_engine.encode_text(text, add_special_tokens=False)
    prompt = _check_ids(ids, service.engine.vocab_size, "messages")
    return _plan(service, req, namespace, [prompt], arrived)
