"""A validated request body -> the service's ``JobRequest``, planned by ``lookupspec.service.planning``
(the one planning path the in-process client takes too)."""

from __future__ import annotations

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


def _messages(req: ChatCompletionRequest) -> list[dict[str, str]]:
    out = []
    for m in req.messages:
        # content parts: only text parts exist for this model
        content = "".join(part.text for part in m.content) if isinstance(m.content, list) else m.content or ""
        out.append({"role": "system" if m.role == "developer" else m.role, "content": content})
    return out


def plan_completion(service: Service, req: CompletionRequest, namespace: str,
                    arrived: float | None = None) -> GenerationJob:
    job = JobRequest(prompt=req.prompt, max_tokens=req.max_tokens, n=req.n, temperature=req.temperature,
                     top_p=req.top_p, top_k=req.top_k, seed=req.seed, stop=req.stop,
                     lookup=_lookup(req.lookup))
    return plan(service, job, namespace, arrived)


def plan_chat(service: Service, req: ChatCompletionRequest, namespace: str,
              arrived: float | None = None) -> GenerationJob:
    use_new = req.max_completion_tokens is not None
    job = JobRequest(messages=_messages(req),
                     max_tokens=req.max_completion_tokens if use_new else req.max_tokens,
                     max_tokens_field="max_completion_tokens" if use_new else "max_tokens",
                     n=req.n, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, seed=req.seed,
                     stop=req.stop, lookup=_lookup(req.lookup))
    return plan(service, job, namespace, arrived)
