"""Prompts that carry a response_format: the extraction prompt set, its validation, the output checks,
and `lookupspec bench` / `bench-serve` runs on a tiny model with a schema per prompt (valid outputs,
the same with speculation on and off)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lookupspec.benchmarks.prompts import EXTRACTION_PROMPTS, BenchPrompt, load_prompts
from lookupspec.benchmarks.serve_load import LoadSettings, Target, request_body
from lookupspec.benchmarks.serve_report import summarize_pass
from lookupspec.benchmarks.validity import output_checker

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# A schema a random tiny model completes within a few tokens: every value is an enum or a small integer.
TINY_SCHEMA = {"type": "object", "properties": {"kind": {"enum": ["alpha", "beta"]},
                                                "n": {"type": "integer", "minimum": 0, "maximum": 9}},
               "required": ["kind", "n"], "additionalProperties": False}
TINY_FORMAT = {"type": "json_schema", "json_schema": {"name": "tiny", "schema": TINY_SCHEMA, "strict": True}}


def _row(i: int, rf: object = None, content: str = "Describe the record: alpha, 7.") -> str:
    row = {"id": f"p{i}", "kind": "extract" if rf else "free",
           "messages": [{"role": "user", "content": content}]}
    if rf is not None:
        row["response_format"] = rf
    return json.dumps(row) + "\n"


# ------------------------------------------------------------------------------------------ the set


def test_the_extraction_set_has_24_prompts_each_with_a_strict_schema_that_compiles():
    from transformers import AutoTokenizer

    from lookupspec.constraints import GrammarCompiler, GrammarSpec

    prompts = load_prompts(EXTRACTION_PROMPTS)
    assert len(prompts) >= 24 and {p.kind for p in prompts} == {"extraction"}
    compiler = GrammarCompiler(AutoTokenizer.from_pretrained(str(FIXTURES / "tokenizer")), 512, [2])
    kinds: set[str] = set()
    for p in prompts:
        rf = p.response_format
        assert rf is not None and rf["type"] == "json_schema" and rf["json_schema"]["strict"] is True, p.id
        schema = p.schema
        assert schema is not None and schema["type"] == "object"
        compiler.compile(GrammarSpec.json_schema(schema))  # raises GrammarError if xgrammar refuses it
        assert output_checker(rf) is not None  # a valid JSON schema
        text = json.dumps(schema)
        kinds |= {k for k in ('"array"', '"enum"', '"number"', '"integer"', '"boolean"') if k in text}
        assert text.count('"type": "object"') > 1, p.id  # nested objects (in a property or an array)
    assert kinds == {'"array"', '"enum"', '"number"', '"integer"', '"boolean"'}


def test_extraction_documents_are_a_few_hundred_tokens_written_for_the_benchmark(real_model_dir):
    from lookupspec.models import load_tokenizer

    sys.path.insert(0, str(EXTRACTION_PROMPTS.parent))
    try:
        import make_extraction_prompts as gen
    finally:
        sys.path.pop(0)
    tok = load_tokenizer(str(real_model_dir))
    lengths = [len(tok.encode(doc, add_special_tokens=False)) for _, _, doc, _ in gen.DOCUMENTS]
    assert len(lengths) >= 24 and all(250 <= n <= 600 for n in lengths), lengths
    # the file is what the generator writes
    lines = EXTRACTION_PROMPTS.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == gen.rows()
    assert "contain no third-party text" in (gen.__doc__ or "")


def test_a_bad_response_format_names_its_row(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text(_row(0, TINY_FORMAT) + _row(1, {"type": "json_schema", "json_schema": {"schema": "x"}}))
    with pytest.raises(ValueError, match=r"p.jsonl:2 \(p1\): 'response_format.json_schema.schema'"):
        load_prompts(bad)
    bad.write_text(_row(0, {"type": "yaml"}))
    with pytest.raises(ValueError, match=r"p.jsonl:1 \(p0\): 'response_format' must be"):
        load_prompts(bad)
    ok = tmp_path / "ok.jsonl"
    ok.write_text(_row(0, {"type": "text"}) + _row(1, {"type": "json_object"}))
    assert [p.response_format for p in load_prompts(ok)] == [None, {"type": "json_object"}]


def test_bench_refuses_a_schema_that_is_not_one_and_names_the_row(tmp_path):
    prompts = tmp_path / "p.jsonl"
    broken = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "objekt"}}}
    prompts.write_text(_row(0, TINY_FORMAT) + _row(1, broken))
    for cmd in ("bench", "bench-serve"):
        proc = subprocess.run([sys.executable, "-m", "lookupspec.cli", cmd, "--prompts", str(prompts),
                               "--model", "no-such-model"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "p1" in proc.stderr and "response_format" in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------- the checks


def test_outputs_are_checked_against_the_schema_independently_of_the_grammar():
    check = output_checker(TINY_FORMAT)
    assert check is not None
    assert check('{"kind": "alpha", "n": 3}') is None
    assert "maximum" in (check('{"kind": "alpha", "n": 12}') or "")
    assert "required" in (check('{"kind": "beta"}') or "")
    assert (check('{"kind": "al') or "").startswith("not JSON")
    obj = output_checker({"type": "json_object"})
    assert obj is not None and obj("{}") is None and obj("[1]") == "not a JSON object"
    assert output_checker(None) is None and output_checker({"type": "text"}) is None
    with pytest.raises(ValueError, match="not a valid JSON schema"):
        output_checker({"type": "json_schema", "json_schema": {"schema": {"type": 5}}})


def test_serve_requests_carry_the_prompts_response_format_and_passes_count_valid_responses():
    prompt = BenchPrompt("p", "k", ({"role": "user", "content": "x"},), TINY_FORMAT)
    body = request_body(Target("http://x", "m", True), LoadSettings(levels=(1,), modes=("on",)), prompt, "on")
    assert body["response_format"] == TINY_FORMAT
    plain = BenchPrompt("q", "k", ({"role": "user", "content": "x"},))
    other, settings = Target("http://x", "m", False), LoadSettings(levels=(1,), modes=("server",))
    assert "response_format" not in request_body(other, settings, plain, "server")
    base = {"error": None, "completion_tokens": 3, "chunk_s": [0.1], "chunk_tokens": None, "ttft_s": 0.1,
            "speculation": None, "prompt_tokens": 5, "start_s": 0.0}
    records = [{**base, "valid": True}, {**base, "valid": False}, {**base, "valid": None}]
    s = summarize_pass(records, 1.0, None)
    assert (s["checked"], s["valid"]) == (2, 1)


# ---------------------------------------------------------------------------------------- end to end


def test_bench_with_a_schema_per_prompt_on_a_tiny_model(tiny_models, tmp_path):
    prompts, out = tmp_path / "p.jsonl", tmp_path / "bench.json"
    prompts.write_text(_row(0, TINY_FORMAT) + _row(1, content="Say hello.") + _row(2, TINY_FORMAT, "alpha 3"))
    proc = subprocess.run(
        [sys.executable, "-m", "lookupspec.cli", "bench", "--model", str(tiny_models["tiny-llama"]),
         "--prompts", str(prompts), "--max-tokens", "24", "--systems", "lookupspec,hf-greedy",
         "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "run only on the 1 prompts without a response_format" in proc.stderr
    assert "lookupspec-plain added" in proc.stderr
    result = json.loads(out.read_text())
    rows = {(r["id"], r["system"]): r for r in result["rows"]}
    assert set(rows) == {("p0", "lookupspec"), ("p0", "lookupspec-plain"), ("p1", "lookupspec"),
                         ("p1", "lookupspec-plain"), ("p1", "hf-greedy"), ("p2", "lookupspec"),
                         ("p2", "lookupspec-plain")}
    for pid in ("p0", "p2"):
        on, off = rows[(pid, "lookupspec")], rows[(pid, "lookupspec-plain")]
        assert on["valid"] is True and off["valid"] is True and on["tokens"] == off["tokens"] and on["exact"]
    assert "valid" not in rows[("p1", "lookupspec")] and rows[("p1", "lookupspec")]["exact"]
    info = {p["id"]: p["reference"] for p in result["prompts"]}
    assert info == {"p0": "lookupspec-plain", "p1": "hf-greedy", "p2": "lookupspec-plain"}
    spec = result["summary"]["by_kind"]["extract"]["systems"]["lookupspec"]
    assert (spec["valid"], spec["checked"], spec["exact"]) == (2, 2, 2)
    assert spec["median_speedup_vs_lookupspec_plain"] is not None and "| valid |" in proc.stdout


@pytest.mark.slow
def test_bench_serve_with_a_schema_per_prompt_on_a_tiny_model(tiny_models, tmp_path):
    prompts, out = tmp_path / "p.jsonl", tmp_path / "serve.json"
    prompts.write_text(_row(0, TINY_FORMAT) + _row(1, TINY_FORMAT, "beta 4") + _row(2, content="Say hello."))
    proc = subprocess.run(
        [sys.executable, "-m", "lookupspec.cli", "bench-serve", "--model", str(tiny_models["tiny-llama"]),
         "--prompts", str(prompts), "--concurrency", "1,2", "--max-tokens", "24", "--warmup", "1",
         "--threads", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for p in result["passes"]:
        s = p["summary"]
        assert (s["errors"], s["checked"], s["valid"]) == (0, 2, 2), s
        by_id = {r["id"]: r for r in p["responses"]}
        assert by_id["p0"]["valid"] and by_id["p2"]["valid"] is None
        assert json.loads(by_id["p0"]["text"])["kind"] in ("alpha", "beta")
        if p["mode"] == "on":
            assert s["on_vs_off"]["compared"] == 3 and s["on_vs_off"]["differ"] == 0
    assert "| valid |" in proc.stdout and "2/2" in proc.stdout
