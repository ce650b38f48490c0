"""Incremental detokenization with OpenAI-style stop strings.

Decoding token by token is wrong for byte-level BPE (a character can span tokens) and decoding the
whole output every step is quadratic. :class:`TextStream` keeps two offsets into the generated ids:
text is produced by decoding a short window ``ids[prefix:]`` and subtracting the already-emitted
decode of ``ids[prefix:read]``; a trailing U+FFFD means an incomplete UTF-8 sequence, so that text is
held back until the next token completes it.

Stop strings are matched on the produced text. Text that could still be the beginning of a stop
string is held back (at most ``max(len(stop)) - 1`` characters), so a client never receives text that
a later token reveals to be part of a stop string. On a match, the text is cut before the stop string
(OpenAI semantics: the stop string itself is not returned) and the stream reports ``finished``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["TextStream"]


class TextStream:
    """Feed generated token ids, get text deltas; ``stop_reached`` tells when a stop string matched."""

    def __init__(self, tokenizer: Any, stop: Sequence[str] = (), *, skip_special_tokens: bool = True) -> None:
        for s in stop:
            if not isinstance(s, str) or s == "":
                raise ValueError("stop strings must be non-empty strings")
        self._tok = tokenizer
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this were turned into text
        self._pending = ""  # text produced but held back (possible stop-string prefix)
        self.text = ""  # everything released so far
        self.stop_reached: str | None = None

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=self._skip)

    def _new_text(self) -> str:
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""  # incomplete character (or nothing new yet): wait for more tokens
        # Slide the window so decode cost stays O(window), keeping a few tokens of left context
        # (byte-level decoders need it for leading spaces and multi-token characters).
        self._prefix = max(self._read - 4, 0) if len(self._ids) - self._prefix > 16 else self._prefix
        self._read = len(self._ids)
        return after[len(before):]

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; returns the text that can be released now ('' if none)."""
        if self.stop_reached is not None:
            return ""
        self._ids.extend(int(t) for t in token_ids)
        self._pending += self._new_text()
        return self._release(final=False)

    def flush(self) -> str:
        """End of generation: release whatever is held back (no stop string can complete now)."""
        if self.stop_reached is not None:
            return ""
        tail = self._decode(self._ids[self._prefix:])
        consumed = self._decode(self._ids[self._prefix:self._read])
        if len(tail) > len(consumed):
            self._pending += tail[len(consumed):]
            self._read = len(self._ids)
        return self._release(final=True)

    def _release(self, *, final: bool) -> str:
        if self._stop:
            # search the held-back text together with what precedes it within a stop length
            window_start = max(len(self.text) - self._hold, 0)
            haystack = self.text[window_start:] + self._pending
            hits = [(haystack.find(s), s) for s in self._stop]
            hits = [(i, s) for i, s in hits if i >= 0]
            if hits:
                idx, s = min(hits)
                cut = window_start + idx  # absolute index of the stop string in all text
                out = (self.text + self._pending)[len(self.text):cut] if cut > len(self.text) else ""
                self.text += out
                self._pending = ""
                self.stop_reached = s
                return out
        if final or not self._stop:
            out, self._pending = self._pending, ""
        else:
            keep = min(self._hold, len(self._pending))
            out = self._pending[: len(self._pending) - keep]
            self._pending = self._pending[len(self._pending) - keep:]
        self.text += out
        return out
