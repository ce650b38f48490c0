"""What a request constrains its output to, and compiling it for one tokenizer."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Grammar", "GrammarCompiler", "GrammarError", "GrammarSpec"]

# The output's JSON layout: xgrammar's default separators with no other whitespace. A model may not
# pad with whitespace (a random test model would never stop), and a fixed layout keeps the outputs of
# a schema comparable.
SEPARATORS = (", ", ": ")


class GrammarError(ValueError):
    """A schema the grammar library cannot compile (or does not support)."""


@dataclass(frozen=True)
class GrammarSpec:
    """A request's constraint: ``json_object`` (any JSON object) or ``json_schema`` (``schema`` is the
    schema's JSON text). ``strict``: properties the schema does not name are refused (OpenAI's
    ``strict: true``; without it a schema's objects still take its properties but may add others
    where the schema does not say ``additionalProperties: false``)."""

    kind: str
    schema: str | None = None
    strict: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("json_object", "json_schema"):
            raise ValueError(f"unknown grammar kind {self.kind!r}: json_object or json_schema")
        if (self.kind == "json_schema") != (self.schema is not None):
            raise ValueError("a json_schema grammar needs its schema, a json_object grammar takes none")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | str, strict: bool = True) -> GrammarSpec:
        """From a schema (a dict or its JSON text), in a compact text so equal schemas share a cache
        entry. The order of keys is kept: the output writes an object's properties in the order the
        schema lists them (as OpenAI's structured outputs do), so two schemas that list them in
        different orders are different grammars. Raises :class:`GrammarError` for text that is not a
        JSON object."""
        try:
            obj = json.loads(schema) if isinstance(schema, str) else schema
        except json.JSONDecodeError as e:
            raise GrammarError(f"the schema is not valid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise GrammarError("a JSON schema must be a JSON object")
        return cls("json_schema", json.dumps(obj, separators=(",", ":")), strict)

    @classmethod
    def json_object(cls) -> GrammarSpec:
        return cls("json_object")


@dataclass(frozen=True, eq=False)
class Grammar:
    """A compiled grammar for one tokenizer (immutable, shared by every sequence that uses it).
    ``vocab_size``: the model's logits width (the tokenizer's ids and any padding rows, which are never
    allowed); ``stop_token_ids``: the tokens that end an output the grammar has completed."""

    spec: GrammarSpec
    compiled: Any  # xgrammar.CompiledGrammar
    vocab_size: int
    stop_token_ids: tuple[int, ...]
    # [words] int32: every token but those holding a raw control character (< 0x20). JSON allows
    # none unescaped in strings and this layout has no whitespace outside them; xgrammar's rule for
    # a string with maxLength lets them through (its plain string rule does not), so every mask is
    # ANDed with this one.
    allowed_anywhere: Any = None
    # text -> token ids with the grammar's tokenizer (no special tokens); it turns the text the
    # grammar forces next (keys, punctuation) into draft tokens. None: no such drafts.
    encode: Callable[[str], list[int]] | None = None


class GrammarCompiler:
    """Compiles :class:`GrammarSpec` s for one tokenizer; keeps the last ``cache_size`` results. Thread
    safe (the gateway validates on the event loop's executor, the engine's thread compiles)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int],
                 cache_size: int = 64) -> None:
        import xgrammar

        if not stop_token_ids:
            raise ValueError("a grammar needs the model's end token ids (to end a completed output)")
        self.vocab_size = int(vocab_size)
        self.stop_token_ids = tuple(int(t) for t in stop_token_ids)
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size,
                                                       stop_token_ids=list(self.stop_token_ids))
        self._allowed_anywhere = _without_control_bytes(info.decoded_vocab, self.vocab_size)
        self._encode = _encoder(tokenizer)
        # one thread: the machine's cores belong to the forward; compiled grammars are cached below
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[GrammarSpec, Grammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def compile(self, spec: GrammarSpec) -> Grammar:
        """The compiled grammar of ``spec``; raises :class:`GrammarError` for a schema xgrammar refuses."""
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                return hit
        schema = '{"type": "object"}' if spec.schema is None else spec.schema
        strict = spec.strict and spec.kind == "json_schema"
        try:
            compiled = self._compiler.compile_json_schema(schema, any_whitespace=False, separators=SEPARATORS,
                                                          strict_mode=strict)
        except (RuntimeError, ValueError, TypeError) as e:
            msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise GrammarError(f"unsupported or invalid JSON schema: {_strip_log_prefix(msg)}") from None
        grammar = Grammar(spec, compiled, self.vocab_size, self.stop_token_ids, self._allowed_anywhere,
                          self._encode)
        with self._lock:
            self._cache[spec] = grammar
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return grammar


def _encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """The tokenizer's ``encode`` without special tokens; [] where it fails (a draft is only a guess)."""
    def encode(text: str) -> list[int]:
        try:
            return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]
        except Exception:  # a tokenizer busy in another thread, an odd character ...
            return []

    return encode


def _without_control_bytes(vocab: Sequence[bytes], vocab_size: int) -> np.ndarray:
    """[words] int32 bitmask: every token but those whose bytes hold a control character (< 0x20)."""
    bits = np.ones(((vocab_size + 31) // 32) * 32, dtype=np.uint8)
    for t, piece in enumerate(vocab[:vocab_size]):
        if any(b < 0x20 for b in piece):
            bits[t] = 0
    return np.packbits(bits, bitorder="little").view("<i4").astype(np.int32)


def _strip_log_prefix(msg: str) -> str:
    """xgrammar's C++ errors start with ``[hh:mm:ss] /path/file.cc:123: ``; keep the message."""
    if msg.startswith("[") and ".cc:" in msg:
        return msg.split(": ", 1)[-1] if ": " in msg else msg
    return msg
