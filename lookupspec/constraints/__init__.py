"""Grammar-constrained decoding: JSON schemas compiled to grammars, and each sequence's grammar state.

The library is xgrammar, chosen by measurement (``python -m tools bench-grammar``, which times both
maintained libraries at SmolLM2's 49,152-token vocabulary on a schema with nested objects, arrays,
an enum, numbers and escaped strings): xgrammar's allowed-token mask was several times faster than
llguidance's, with a far shorter tail; both consume and roll back a token in about a microsecond
and copy a whole state in a few. For draft trees lookupspec walks each tree depth first with
rollback (consume a node, compute its mask, visit its children, roll back), which both support;
llguidance refused an end token after an accepted end token was rolled back, xgrammar did not.
xgrammar needs torch and transformers, which lookupspec depends on anyway.

- :class:`GrammarSpec`: what a request asks for (any JSON object, or a JSON schema), hashable.
- :class:`GrammarCompiler`: one per tokenizer; compiles specs (cached) into :class:`Grammar`
  handles, raising :class:`GrammarError` (a ``ValueError``) for a schema it cannot compile.
- :class:`GrammarState`: one per sequence; walks a draft tree along its paths, prunes the nodes the
  grammar forbids before the forward, and gives the allowed-token mask of every kept row.
"""

from lookupspec.constraints.grammar import Grammar, GrammarCompiler, GrammarError, GrammarSpec
from lookupspec.constraints.state import GrammarState, TreeMasks, apply_bitmask

__all__ = ["Grammar", "GrammarCompiler", "GrammarError", "GrammarSpec", "GrammarState", "TreeMasks",
           "apply_bitmask"]
