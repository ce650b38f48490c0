"""The RAG example (``python -m lookupspec.examples.rag``): its BM25 ranking and passage splitting on
toy data, and the whole pipeline against a real gateway subprocess on the tiny model (whose answer is
gibberish: the test checks the structure, the collection and the statistics)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from lookupspec.examples.rag import BM25, build_messages, load_passages, tokenize

ROOT = Path(__file__).resolve().parents[2]

CORPUS = [
    "The red fox jumps over the fence at dawn.",
    "A fox is a small omnivorous mammal.",
    "Red paint dries slowly in cold weather.",
    "Lighthouses guide ships along the rocky coast.",
]


def test_bm25_ranks_passages_with_more_query_terms_first() -> None:
    bm25 = BM25([tokenize(p) for p in CORPUS])
    assert bm25.top(tokenize("red fox"), 4) == [0, 1, 2]  # both words, then the rarer-term one
    assert bm25.top(tokenize("Lighthouses"), 3) == [3]
    assert bm25.top(tokenize("submarine"), 3) == []  # no shared term: nothing retrieved
    scores = bm25.scores(tokenize("fox fox"))
    assert scores[0] > 0 and scores[1] > scores[0]  # same tf, the shorter passage wins
    assert all(v > 0 for v in bm25.idf.values())


def test_bm25_saturates_term_frequency() -> None:
    bm25 = BM25([["fox"] * 1 + ["x"] * 9, ["fox"] * 5 + ["x"] * 5, ["fox"] * 9 + ["x"]])
    s = bm25.scores(["fox"])
    assert s[0] < s[1] < s[2] and (s[2] - s[1]) < (s[1] - s[0])


def test_passages_are_paragraphs_merged_up_to_the_limit(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.md").write_text("First para.\n\nSecond para.\n\n\n" + "x" * 50)
    (tmp_path / "sub" / "b.txt").write_text("Only one.")
    (tmp_path / "skip.json").write_text("{}")
    passages = load_passages(tmp_path, max_chars=30)
    assert [(p.id, p.text) for p in passages] == [("a.md#0", "First para.\n\nSecond para."),
                                                  ("a.md#1", "x" * 50), ("sub/b.txt#0", "Only one.")]
    msgs = build_messages("Why?", passages[:1])
    assert msgs[1]["content"] == "Passages:\n\n[1] (a.md)\nFirst para.\n\nSecond para.\n\nQuestion: Why?"


@pytest.mark.slow
def test_rag_example_end_to_end_against_a_gateway(tiny_gateway, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "keys.md").write_text("# API keys\n\nRotate the API keys every ninety days.\n\n"
                                  "Old keys stop working one day after rotation.")
    (docs / "ships.txt").write_text("Lighthouses guide ships along the rocky coast.")
    env = {k: v for k, v in os.environ.items() if k != "LOOKUPSPEC_API_KEY"}
    proc = subprocess.run([sys.executable, "-m", "lookupspec.examples.rag", "--gateway", tiny_gateway.url,
                           "--docs", str(docs), "--question", "How often are API keys rotated?",
                           "--collection", "rag-test", "--top-k", "1", "--max-tokens", "24"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "indexed 2 passages into collection 'rag-test'" in out
    assert "retrieved: keys.md#0\n" in out
    answer = out.split("answer:\n", 1)[1].split("\nspeculation: ", 1)[0]
    assert answer.strip(), "the answer is printed"
    assert "\nspeculation: acceptance length " in out and "24 completion tokens" in out
    assert "draft tokens " in out and "accepted by source " in out

    detail = httpx.get(f"{tiny_gateway.url}/v1/collections/rag-test", timeout=10).json()
    assert detail["document_count"] == 2
    assert sorted(d["id"] for d in detail["documents"]) == ["keys.md#0", "ships.txt#0"]


def test_a_second_server_on_the_gateways_data_directory_is_told_who_holds_it_and_about_data_dir(
        tiny_gateway) -> None:
    """A second `lookupspec serve` on a data directory that a running server holds (one started next
    to `make serve`, say) stops, and the store's error, which `serve` prints as `error: ...`, says
    which process, on which port, holds the data directory, and how to use another one."""
    from lookupspec.store import EmbeddedConfig, EmbeddedLog, StoreLockedError

    with pytest.raises(StoreLockedError) as caught:
        EmbeddedLog(EmbeddedConfig(tiny_gateway.data_dir))
    message = str(caught.value)
    assert tiny_gateway.proc is not None
    assert f"is in use by process {tiny_gateway.proc.pid} (" in message
    assert f"serve --model {tiny_gateway.model} --port {tiny_gateway.port}" in message  # its command line
    assert "`lookupspec serve --data-dir DIR` (or LOOKUPSPEC_DATA_DIR)" in message
