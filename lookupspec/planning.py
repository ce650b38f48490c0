"""From a request's ``lookup`` options to the ``(SpecParams, LookupScope)`` the engine runs with.

One planning path for every front end: the gateway (``gateway/planning.py``) and the in-process
client (``lookupspec.client.LocalClient``) both call :func:`plan_lookup`, each passing in how it finds
a collection's store and how it builds a store over inline texts. No HTTP, no pydantic: a bad option
raises :class:`PlanError` naming the request ``param``, which each front end turns into its own error.

The rules, decided once:

- speculation runs only if both the server's settings and the request allow it (``enabled``);
- every named collection must exist, whatever the sources (a misspelt name is an error, not a silent
  no-op); its store is in scope only when speculation is enabled and ``corpus`` is a source;
- inline ``documents`` are indexed only when speculation is enabled and ``corpus`` is a source
  (building that index costs time; nothing else would read it);
- the namespace's output index is in scope only when speculation is enabled and ``output`` is a source.

After the request, its output is appended to the namespace's output index whether or not the request
speculated (both front ends do this): the store serves later requests, and a plain-decoding request's
text is as good a source for them as any other.

Example: ``sources=("context",)`` with ``documents=("some text",)`` gives a scope with no corpora and no
output index, and the inline builder is never called.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lookupspec.params import LookupScope, SpecParams

__all__ = ["LookupPlan", "PlanError", "UnknownCollection", "plan_lookup"]


class PlanError(ValueError):
    """A request option the planner refuses. ``status`` follows HTTP (400 bad value, 404 unknown
    collection); ``param`` names the request field, e.g. ``lookup.collections[1]``."""

    def __init__(self, message: str, *, param: str | None, status: int = 400,
                 code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code


class UnknownCollection(LookupError):
    """Raised by a front end's collection lookup for a collection that does not exist."""


@dataclass(frozen=True)
class LookupPlan:
    spec: SpecParams
    scope: LookupScope


def _spec_error(message: str) -> PlanError:
    if message.startswith("unknown lookup sources"):
        return PlanError(message, param="lookup.sources")
    if message.startswith("max_draft_tokens"):
        return PlanError(message, param="lookup.max_draft_tokens")
    return PlanError(message, param="lookup")


def plan_lookup(base: SpecParams, *, enabled: bool = True, collections: Sequence[str] = (),
                documents: Sequence[str] = (), max_draft_tokens: int | None = None,
                sources: Sequence[str] | None = None,
                collection: Callable[[str], Any | None],
                inline_corpus: Callable[[Sequence[str]], Any | None],
                output: Any | None) -> LookupPlan:
    """``base``: the server's (engine's) speculation settings, narrowed by the request's options.

    collection(name): the collection's corpus index, ``None`` when it exists but has nothing indexed
        (all its documents deleted), raising :class:`UnknownCollection` when it does not exist.
    inline_corpus(texts): a throw-away corpus index over the request's inline documents (``None`` when
        they hold no tokens); called at most once, and only when the corpus source is in use.
    output: the namespace's output index (``None``: it has none yet).
    """
    try:
        spec = base.for_request(enabled=enabled, max_draft_tokens=max_draft_tokens, sources=sources,
                                collections=collections)
    except ValueError as exc:
        raise _spec_error(str(exc)) from None
    stores = []
    for name in spec.collections:  # deduplicated, order kept
        try:
            store = collection(name)
        except UnknownCollection:
            index = list(collections).index(name)  # the first mention in the request
            raise PlanError(f"no collection named {name!r}", param=f"lookup.collections[{index}]",
                            status=404, code="collection_not_found") from None
        if store is not None:
            stores.append(store)
    use_corpus = spec.enabled and "corpus" in spec.sources
    corpora: list[Any] = stores if use_corpus else []
    if use_corpus and documents:
        inline = inline_corpus(documents)
        if inline is not None:
            corpora.append(inline)
    in_scope_output = output if spec.enabled and "output" in spec.sources else None
    return LookupPlan(spec, LookupScope(corpora=tuple(corpora), output=in_scope_output))
