"""Grammar-constrained decoding: JSON schemas compiled to grammars, and each sequence's grammar state.

The library is xgrammar. ``tools/grammar_mask_bench.py`` measured it against llguidance at SmolLM2's
49,152-token vocabulary on a schema with nested objects, arrays, an enum, numbers and escaped
strings: xgrammar's allowed-token mask took a median of about 6 us per token (p99 about 30 us),
llguidance's about 17 us (p99 about 370 us); both consume and roll back a token in under 1 us and
copy a whole state in under 10 us. For draft trees lookupspec walks each tree depth first with
rollback (consume a node, compute its mask, visit its children, roll back); llguidance 1.9.1 refuses
an end token after an accepted end token was rolled back, xgrammar does not. xgrammar needs torch
and transformers, which lookupspec depends on anyway.

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
