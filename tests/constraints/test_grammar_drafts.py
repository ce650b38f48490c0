"""The grammar's own drafts: the text a strict schema forces next (keys, punctuation), drafted in the
tokenizer's tokens, with the drafters' tree grafted onto it; the state is back at the root after."""

from __future__ import annotations

from pathlib import Path

import pytest

from lookupspec.constraints import GrammarCompiler, GrammarSpec, GrammarState
from lookupspec.constraints.state import graft

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
EOS = 2
SCHEMA = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8},
                                           "kind": {"enum": ["alpha", "beta"]}},
          "required": ["zone", "kind"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(FIXTURES / "tokenizer"))


@pytest.fixture(scope="module")
def state(tokenizer) -> GrammarState:
    return GrammarState(GrammarCompiler(tokenizer, 512, [EOS]).compile(GrammarSpec.json_schema(SCHEMA)))


def test_graft_merges_the_nodes_that_spell_the_chain_and_hangs_the_rest_below() -> None:
    assert graft([5, 6], [5, 7, 8], [-1, 0, 0]) == ([5, 6, 7, 8], [-1, 0, 0, 0], [0, -1, 1, 2])
    # a tree that follows the whole chain continues below its end; a sibling of the root stays one
    assert graft([5, 6], [5, 6, 9, 4], [-1, 0, 1, -1]) == ([5, 6, 9, 4], [-1, 0, 1, -1], [0, 1, 2, 3])
    assert graft([5], [], []) == ([5], [-1], [-1])


def test_the_walk_drafts_the_forced_text_in_the_tokenizers_tokens(state, tokenizer) -> None:
    plain = state.walk([], [], {EOS})
    assert plain.kept == () and plain.tokens == ()
    masks = state.walk([], [], {EOS}, jump=16)
    assert masks.kept == (-1,) * len(masks.tokens) and masks.drafted == len(masks.tokens) > 1
    assert tokenizer.decode(list(masks.tokens)) == '{"zone": "'
    assert masks.parents == tuple(range(-1, len(masks.tokens) - 1))
    assert masks.masks.shape[0] == len(masks.tokens) + 1
    assert state.walk([], [], {EOS}, jump=2).tokens == masks.tokens[:2]
    # the state is at the root again: the forced text can be committed, then a value is free
    value = tokenizer.encode('ab", "kind": "', add_special_tokens=False)
    assert state.commit([*masks.tokens, *value]) == len(masks.tokens) + len(value)
    free = state.walk([], [], {EOS}, jump=16)
    assert tokenizer.decode(list(free.tokens)) in ("alpha", "beta", "")  # enum values share no prefix


def test_drafter_nodes_that_disagree_with_the_forced_text_are_pruned(state, tokenizer) -> None:
    fresh = GrammarState(state.grammar)
    forced = list(fresh.walk([], [], {EOS}, jump=16).tokens)
    wrong = tokenizer.encode("[", add_special_tokens=False)[0]
    masks = fresh.walk([forced[0], wrong], [-1, -1], {EOS}, jump=16)
    assert masks.tokens == tuple(forced) and masks.kept[0] == 0 and set(masks.kept[1:]) == {-1}
