"""A byte bound above which a prompt cannot fit the context window, checked before tokenizing.

Tokenizing costs CPU in proportion to the text (a 15 MB prompt takes ~10 s on our machines), and a
prompt that does not fit the window is refused after tokenizing anyway. So the gateway first counts
the prompt's *countable bytes* (its UTF-8 bytes, less those the tokenizer drops, see below; one
linear pass, ~20 ms for 15 MB) and refuses it unless

    countable_bytes <= L * (window - 1)

where ``L`` is the most bytes of input one token can stand for.

Why no prompt that fits is refused: a prompt fits only with at most ``window - 1`` tokens (one
position must be left for the completion). Each countable byte is covered by some token and no token
covers more than ``L`` bytes, so ``tokens >= countable_bytes / L``; if ``countable_bytes > L * (window
- 1)`` then ``tokens > window - 1``, and the prompt would be refused after tokenizing too. Special
tokens the tokenizer adds (a BOS) and the text a chat template adds only add tokens.

"Each countable byte is covered by a token" holds for byte-level BPE without a normalizer (GPT-2
style: SmolLM2, the test fixtures): the pre-tokenizer maps every byte to one alphabet character, so a
regular token's length in characters is the number of bytes it covers; BPE skips characters missing
from its vocabulary (SmolLM2 has no token for a few control bytes such as 0x04, nor for the UTF-8 lead
bytes 0xF1 and 0xF2), which is why those bytes are not counted. Added tokens (``<|im_start|>``) are
matched on the raw text and cover their content's UTF-8 length. Any other tokenizer (a normalizer can
drop or fold characters) gets no bound: :meth:`PromptBound.for_tokenizer` returns None, and only the
request body limit bounds the text.

Example: SmolLM2's longest token covers 81 bytes; with an 8192-token window the bound is
81 * 8191 = 663,471 countable bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["PromptBound"]

_LOSSLESS_PIECES = {"ByteLevel", "Split", "Digits", "Punctuation"}  # pre-tokenizers that drop nothing


def _byte_to_char() -> dict[int, str]:
    """GPT-2's byte-level alphabet: the character each byte is spelled with in the vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    out = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def _lossless_pre_tokenizer(pre: dict[str, Any] | None) -> bool:
    if pre is None:
        return False
    if pre.get("type") == "Sequence":
        parts = pre.get("pretokenizers") or []
        return any(p.get("type") == "ByteLevel" for p in parts) and all(
            p.get("type") in _LOSSLESS_PIECES and str(p.get("behavior", "")).lower() != "removed"
            for p in parts)
    return pre.get("type") == "ByteLevel"


@dataclass(frozen=True)
class PromptBound:
    """bytes_per_token: ``L``, the most input bytes one token covers. dropped: the byte values the
    tokenizer skips (no token holds them), not counted."""

    bytes_per_token: int
    dropped: bytes = b""

    def __post_init__(self) -> None:
        if self.bytes_per_token < 1:
            raise ValueError(f"bytes_per_token must be >= 1, got {self.bytes_per_token}")

    def countable_bytes(self, text: str) -> int:
        raw = text.encode("utf-8", "surrogatepass")
        return len(raw.translate(None, self.dropped)) if self.dropped else len(raw)

    def limit(self, window: int) -> int:
        """The most countable bytes a prompt that fits ``window`` tokens can have."""
        return self.bytes_per_token * max(window - 1, 0)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> PromptBound | None:
        """The bound of a byte-level BPE tokenizer without a normalizer; None for any other."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        try:
            spec = json.loads(backend.to_str())
        except (ValueError, AttributeError, TypeError):
            return None
        model = spec.get("model") or {}
        if spec.get("normalizer") is not None or model.get("type") != "BPE":
            return None
        if not _lossless_pre_tokenizer(spec.get("pre_tokenizer")):
            return None
        vocab: dict[str, int] = model.get("vocab") or {}
        added = [str(t.get("content", "")) for t in spec.get("added_tokens") or ()]
        added_set = set(added)
        regular = max((len(tok) for tok in vocab if tok not in added_set), default=1)
        special = max((len(content.encode("utf-8")) for content in added), default=1)
        dropped = bytes(b for b, ch in sorted(_byte_to_char().items()) if ch not in vocab)
        return cls(max(regular, special, 1), dropped)
