"""lookupspec.planning: the one path from a request's lookup options to (SpecParams, LookupScope) that
the gateway and the in-process client share. Plain objects stand in for stores: the planner only
passes them through."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from lookupspec.params import SpecParams
from lookupspec.planning import PlanError, UnknownCollection, plan_lookup


class Front:
    """What a front end passes in: collections by name (None: exists, nothing indexed), an inline
    builder that records its calls, an output index."""

    def __init__(self) -> None:
        self.collections: dict[str, object | None] = {"docs": "docs-store", "emptied": None}
        self.inline_calls: list[tuple[str, ...]] = []
        self.output = "output-store"

    def collection(self, name: str) -> object | None:
        if name not in self.collections:
            raise UnknownCollection(name)
        return self.collections[name]

    def inline(self, texts: Sequence[str]) -> object:
        self.inline_calls.append(tuple(texts))
        return "inline-store"

    def plan(self, base: SpecParams | None = None, **options: object):
        return plan_lookup(base or SpecParams(), collection=self.collection, inline_corpus=self.inline,
                           output=self.output, **options)  # type: ignore[arg-type]


def test_defaults_draft_from_everything_the_request_names() -> None:
    front = Front()
    plan = front.plan(collections=("docs", "emptied", "docs"), documents=("x",))
    assert plan.spec.enabled and plan.spec.collections == ("docs", "emptied")
    assert plan.scope.corpora == ("docs-store", "inline-store") and plan.scope.output == "output-store"


@pytest.mark.parametrize("options", [{"sources": ("context",)}, {"sources": ("output", "draft_model")},
                                     {"enabled": False}])
def test_inline_documents_are_indexed_only_when_the_corpus_source_is_used(options: dict) -> None:
    front = Front()
    plan = front.plan(collections=("docs",), documents=("inline text",), **options)
    assert front.inline_calls == [] and plan.scope.corpora == ()


def test_the_server_switching_speculation_off_wins() -> None:
    front = Front()
    plan = front.plan(SpecParams(enabled=False), documents=("x",), sources=("corpus", "output"))
    assert not plan.spec.enabled and plan.scope.corpora == () and plan.scope.output is None
    assert front.inline_calls == []


@pytest.mark.parametrize(("options", "in_scope"), [({}, True), ({"sources": ("output",)}, True),
                                                   ({"sources": ("context", "corpus")}, False),
                                                   ({"enabled": False}, False)])
def test_the_output_store_is_in_scope_only_when_speculating_with_the_output_source(options: dict,
                                                                                  in_scope: bool) -> None:
    assert (Front().plan(**options).scope.output == "output-store") is in_scope


def test_unknown_collections_are_404_naming_their_first_mention_whatever_the_sources() -> None:
    for options in ({}, {"sources": ("context",)}, {"enabled": False}):
        with pytest.raises(PlanError) as err:
            Front().plan(collections=("docs", "nope", "nope"), **options)
        assert (err.value.status, err.value.param, err.value.code) == (404, "lookup.collections[1]",
                                                                       "collection_not_found")


@pytest.mark.parametrize(("options", "param"), [({"sources": ("telepathy",)}, "lookup.sources"),
                                                ({"max_draft_tokens": 1000}, "lookup.max_draft_tokens")])
def test_bad_options_name_their_param(options: dict, param: str) -> None:
    with pytest.raises(PlanError) as err:
        Front().plan(**options)
    assert err.value.status == 400 and err.value.param == param


def test_an_inline_builder_without_tokens_adds_no_store() -> None:
    front = Front()
    plan = plan_lookup(SpecParams(), documents=("",), collection=front.collection,
                       inline_corpus=lambda texts: None, output=None)
    assert plan.scope.corpora == () and plan.scope.output is None
