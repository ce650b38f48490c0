"""Retrieval-augmented answering against a lookupspec gateway, end to end in one file.

1. Split the .txt/.md files of a folder into passages (paragraphs, merged up to ~800 characters).
2. Index them into a collection through the HTTP API (``POST /v1/collections/NAME/documents``).
3. Rank the passages for the question with BM25 (the class below, a dozen lines).
4. Ask ``/v1/chat/completions`` with the top passages in the prompt and ``lookup.collections=[NAME]``,
   so the answer can draft from the whole collection, not only from the passages in the prompt.
5. Print the answer as it streams, then the speculation statistics.

Run it against a gateway (``lookupspec serve``)::

    python -m lookupspec.examples.rag --gateway http://127.0.0.1:8000 --docs ./docs \\
        --question "How do I rotate the API keys?" --collection handbook --top-k 3

The same request with the ``openai`` client (lookupspec's extension goes in ``extra_body``)::

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="sk-...")
    resp = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=messages, max_tokens=256, temperature=0,
        extra_body={"lookup": {"collections": ["handbook"]}})
    print(resp.choices[0].message.content)
    print(resp.model_extra["speculation"]["acceptance_length"])  # lookupspec's statistics
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lookupspec.client import ClientError, GatewayClient, GenerationRequest, Lookup

__all__ = ["BM25", "Passage", "build_messages", "load_passages", "main", "tokenize"]

SUFFIXES = (".txt", ".md")


def tokenize(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


class BM25:
    """Okapi BM25 over pre-tokenized passages. ``score(q, d) = sum over query terms t of
    idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))``, with
    ``idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))`` (always positive).
    Example: for the query "red fox", a passage with both words outranks one with only "fox"."""

    def __init__(self, passages: Sequence[Sequence[str]], k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.tf = [Counter(p) for p in passages]
        self.len = [len(p) for p in passages]
        self.avgdl = sum(self.len) / max(len(passages), 1) or 1.0
        df = Counter(t for counts in self.tf for t in counts)
        n = len(passages)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: Sequence[str]) -> list[float]:
        out = []
        for tf, length in zip(self.tf, self.len, strict=True):
            norm = self.k1 * (1 - self.b + self.b * length / self.avgdl)
            out.append(sum(self.idf.get(t, 0.0) * tf[t] * (self.k1 + 1) / (tf[t] + norm)
                           for t in query if t in tf))
        return out

    def top(self, query: Sequence[str], k: int) -> list[int]:
        """Indices of the ``k`` best passages with a positive score, best first (ties: input order)."""
        scores = self.scores(query)
        ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        return [i for i in ranked[:k] if scores[i] > 0]


class Passage:
    __slots__ = ("id", "source", "text")

    def __init__(self, id: str, source: str, text: str) -> None:
        self.id, self.source, self.text = id, source, text


def load_passages(folder: str | Path, max_chars: int = 800) -> list[Passage]:
    """Paragraphs (blank-line separated) of every .txt/.md file below ``folder``, consecutive ones
    merged while they fit in ``max_chars``; ids are ``relative/path.md#N``."""
    root = Path(folder)
    out: list[Passage] = []
    for path in sorted(p for p in root.rglob("*") if p.suffix.lower() in SUFFIXES and p.is_file()):
        rel = path.relative_to(root).as_posix()
        chunks: list[str] = []
        for para in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")):
            para = para.strip()
            if not para:
                continue
            if chunks and len(chunks[-1]) + len(para) + 2 <= max_chars:
                chunks[-1] += "\n\n" + para
            else:
                chunks.append(para)
        out.extend(Passage(f"{rel}#{n}", rel, text) for n, text in enumerate(chunks))
    return out


def build_messages(question: str, passages: Sequence[Passage]) -> list[dict[str, str]]:
    context = "\n\n".join(f"[{n}] ({p.source})\n{p.text}" for n, p in enumerate(passages, start=1))
    return [
        {"role": "system", "content": "Answer the question using only the passages. Quote them where you "
                                      "can and cite them as [n]. If they do not contain the answer, say so."},
        {"role": "user", "content": f"Passages:\n\n{context}\n\nQuestion: {question}"},
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lookupspec.examples.rag",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--gateway", required=True, metavar="URL", help="lookupspec gateway base URL")
    parser.add_argument("--docs", required=True, type=Path, help="folder of .txt/.md documents")
    parser.add_argument("--question", required=True)
    parser.add_argument("--collection", default="rag-example", help="collection to index the passages into")
    parser.add_argument("--top-k", type=int, default=3, help="passages put in the prompt")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--model", default=None, help="model id (default: the gateway's)")
    parser.add_argument("--api-key", default=None, help="API key [env LOOKUPSPEC_API_KEY]")
    args = parser.parse_args(argv)

    passages = load_passages(args.docs)
    if not passages:
        print(f"error: no .txt/.md text under {args.docs}", file=sys.stderr)
        return 2
    api_key = args.api_key or os.environ.get("LOOKUPSPEC_API_KEY") or None
    try:
        spec, usage = _ask(GatewayClient(args.gateway, api_key=api_key, model=args.model), args, passages)
    except ClientError as exc:
        print(f"\nerror: {exc}", file=sys.stderr)
        return 2
    draft, accepted = spec.get("draft_tokens", 0), spec.get("accepted_tokens", 0)
    rate = f" ({accepted / draft:.1%})" if draft else ""
    print(f"speculation: acceptance length {spec.get('acceptance_length', 0.0):.2f} "
          f"over {spec.get('steps', 0)} steps, {usage.get('completion_tokens', 0)} completion tokens")
    print(f"  draft tokens {draft}, accepted {accepted}{rate}; "
          f"accepted by source {spec.get('accepted_tokens_by_source', {})}")
    return 0


def _ask(client: GatewayClient, args: argparse.Namespace,
         passages: Sequence[Passage]) -> tuple[dict[str, Any], dict[str, int]]:
    """Index, retrieve, generate (streamed to stdout); the final speculation and usage."""
    with client:
        docs = [{"id": p.id, "text": p.text, "metadata": {"source": p.source}} for p in passages]
        n = client.add_documents(args.collection, docs)
        print(f"indexed {n} passages into collection {args.collection!r}")
        bm25 = BM25([tokenize(p.text) for p in passages])
        hits = [passages[i] for i in bm25.top(tokenize(args.question), args.top_k)]
        print("retrieved: " + (", ".join(p.id for p in hits) or "nothing (answering without passages)"))
        request = GenerationRequest(messages=build_messages(args.question, hits), max_tokens=args.max_tokens,
                                    temperature=0, lookup=Lookup(collections=(args.collection,)))
        print("answer:")
        spec: dict[str, Any] = {}
        usage: dict[str, int] = {}
        for delta in client.stream(request):
            sys.stdout.write(delta.text)
            sys.stdout.flush()
            spec, usage = delta.speculation or spec, delta.usage or usage
    print()
    return spec, usage


if __name__ == "__main__":
    raise SystemExit(main())
