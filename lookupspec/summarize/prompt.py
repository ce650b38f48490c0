"""The prompt a summarization request sends: chat messages with the document in place of ``{text}``.

The built-in prompt is a system message plus a user message ending in the document after a ``---``
line (the layout of the ``summarize`` prompts in ``fixtures/bench/prompts.jsonl``). ``--prompt-template
FILE`` replaces both with one user message: the file's text, ``{text}`` replaced by the document.
Only ``{text}`` is substituted (no ``str.format``), so other braces in a template stay as written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_TEMPLATE", "PLACEHOLDER", "PromptTemplate"]

PLACEHOLDER = "{text}"


@dataclass(frozen=True)
class PromptTemplate:
    user: str
    system: str | None = None

    def __post_init__(self) -> None:
        if PLACEHOLDER not in self.user:
            raise ValueError(f"a prompt template needs a {PLACEHOLDER} placeholder for the document")

    @classmethod
    def from_file(cls, path: str | Path) -> PromptTemplate:
        return cls(Path(path).read_text(encoding="utf-8"))

    def messages(self, text: str) -> list[dict[str, str]]:
        user = {"role": "user", "content": self.user.replace(PLACEHOLDER, text)}
        return [{"role": "system", "content": self.system}, user] if self.system else [user]


DEFAULT_TEMPLATE = PromptTemplate(
    system="You are a precise technical writer. You summarize documents faithfully: keep the terminology "
           "of the source and do not invent facts.",
    user="Summarize the following document in a short paragraph that keeps its key facts.\n\n---\n{text}",
)
