"""`lookupspec summarize`: the batch job's parts (inputs, the output file, the report, the measured
speedup) on hand-made data, then the real CLI in a subprocess on the tiny model: bad lines, --strict,
directories, resume, a torn output line, kill -9 and Ctrl-C mid-run, --plot without matplotlib and on
a rerun with nothing left, and the gateway mode giving the same summaries as the in-process one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lookupspec.summarize.inputs import BadInput, Document, read_documents
from lookupspec.summarize.interrupts import Interrupts, JobInterrupted
from lookupspec.summarize.job import FatalError, JobConfig, plan
from lookupspec.summarize.outputs import OutputFile
from lookupspec.summarize.prompt import DEFAULT_TEMPLATE, PromptTemplate
from lookupspec.summarize.report import JobReport
from lookupspec.summarize.speedup import PlainSample, measure_speedup, step_spread

ROOT = Path(__file__).resolve().parents[2]
WORDS = ["river", "lighthouse", "harbour", "engine", "signal", "market", "garden", "winter", "letter",
         "castle", "mountain", "bridge", "forest", "library", "station", "window"]


def _text(i: int, sentences: int = 4) -> str:
    w = WORDS[i % len(WORDS)], WORDS[(3 * i + 1) % len(WORDS)], WORDS[(5 * i + 2) % len(WORDS)]
    return " ".join(f"The {w[0]} near the {w[1]} was built in year {1800 + i + s}; "
                    f"every {w[2]} there has a story." for s in range(sentences))


def _write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _records(path: Path) -> list[dict]:
    """Every line of a JSONL file, which must be complete (newline-terminated) and parse."""
    data = path.read_text(encoding="utf-8")
    assert data == "" or data.endswith("\n"), "the output must end with a complete line"
    return [json.loads(line) for line in data.splitlines()]


def _cli(*args: str | Path, home: Path, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_command(*args), env=_env(home), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _command(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "lookupspec.cli", "summarize", *map(str, args)]


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOOKUPSPEC_API_KEY", "LOOKUPSPEC_MODEL")}
    env.update(LOOKUPSPEC_HOME=str(home), PYTHONUNBUFFERED="1")
    return env


# ---- inputs -------------------------------------------------------------------------------------


def test_jsonl_reader_reports_bad_lines_with_their_numbers_and_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"id": "a", "text": "one"}\n'
                     b'{not json\n'
                     b'\n'
                     b'[1, 2]\n'
                     b'{"id": "b", "body": "x"}\n'
                     b'{"id": "c", "text": "  "}\n'
                     b'{"id": "a", "text": "again"}\n'
                     b'{"id": true, "text": "t"}\n'
                     b'\xff\xfe\n'
                     b'{"text": "no id"}\n'
                     b'{"id": 7, "text": "int id"}\n')
    items = list(read_documents(path))
    docs = [i for i in items if isinstance(i, Document)]
    bad = {i.line: i.message for i in items if isinstance(i, BadInput)}
    assert [(d.id, d.text, d.line) for d in docs] == [("a", "one", 1), ("10", "no id", 10),
                                                      ("7", "int id", 11)]
    assert sorted(bad) == [2, 4, 5, 6, 7, 8, 9]
    assert "not JSON" in bad[2] and "object" in bad[4] and "'text'" in bad[5] and "empty" in bad[6]
    assert "duplicate id 'a' (first at line 1)" in bad[7] and "UTF-8" in bad[9]
    assert str(next(i for i in items if isinstance(i, BadInput))).startswith(f"{path}:2: ")


def test_jsonl_reader_uses_the_named_fields(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "in.jsonl", [{"key": "k1", "body": "hello"}, {"key": "k2", "text": "x"}])
    items = list(read_documents(path, text_field="body", id_field="key"))
    assert isinstance(items[0], Document) and items[0].id == "k1" and items[0].text == "hello"
    assert isinstance(items[1], BadInput) and items[1].line == 2


def test_directory_documents_are_text_files_named_by_relative_path(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "sub" / "b.md").write_text("beta")
    (tmp_path / "c.json").write_text("{}")
    (tmp_path / "empty.md").write_text("\n")
    items = list(read_documents(tmp_path))
    docs = [(i.id, i.text) for i in items if isinstance(i, Document)]
    assert docs == [("a.txt", "alpha"), ("sub/b.md", "beta")]
    assert [i.message for i in items if isinstance(i, BadInput)] == ["empty file"]


# ---- the output file ----------------------------------------------------------------------------


def test_output_file_appends_and_reopening_collects_done_ids(tmp_path: Path) -> None:
    path = tmp_path / "out" / "o.jsonl"
    with OutputFile.open(path)[0] as out:
        out.append({"id": "a", "summary": "x"})
        out.append({"id": "b", "summary": "ünïcode"})
    out, rec = OutputFile.open(path)
    out.close()
    assert rec.done == {"a", "b"} and rec.lines == 2 and rec.truncated_bytes == 0
    assert [r["summary"] for r in _records(path)] == ["x", "ünïcode"]


@pytest.mark.parametrize("tail", [b'{"id": "c", "summ', b'{"id": "c"}', b'{"id": "c", "su\n'])
def test_a_torn_last_line_is_cut_off(tmp_path: Path, tail: bytes) -> None:
    path = tmp_path / "o.jsonl"
    good = b'{"id": "a"}\n{"id": "b"}\n'
    path.write_bytes(good + tail)
    out, rec = OutputFile.open(path)
    out.append({"id": "c"})
    out.close()
    assert rec.done == {"a", "b"} and rec.truncated_bytes == len(tail)
    assert [r["id"] for r in _records(path)] == ["a", "b", "c"]


def test_an_unreadable_middle_line_is_kept_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "o.jsonl"
    path.write_bytes(b'{"id": "a"}\ngarbage\n{"id": "b"}\n')
    out, rec = OutputFile.open(path)
    out.close()
    assert rec.done == {"a", "b"} and rec.bad_lines == [2] and rec.truncated_bytes == 0
    assert path.read_bytes() == b'{"id": "a"}\ngarbage\n{"id": "b"}\n'


# ---- planning, prompts, signals -----------------------------------------------------------------


def test_plan_skips_done_ids_and_bad_entries_and_applies_the_limit() -> None:
    items: list[Document | BadInput] = [Document("a", "x", 1), BadInput("f", 2, "bad"), Document("b", "y", 3),
                                        Document("c", "z", 4), Document("d", "w", 5)]
    report = JobReport()
    logged: list[str] = []
    docs = plan(items, {"b"}, JobConfig(limit=2, log=logged.append), report)
    assert [d.id for d in docs] == ["a", "c"]
    assert report.skipped_done == 1 and len(report.bad_inputs) == 1
    assert logged == ["skipping bad input: f:2: bad"]
    with pytest.raises(FatalError, match="f:2: bad"):
        plan(items, set(), JobConfig(strict=True), JobReport())


def test_prompt_template_substitutes_only_the_text_placeholder(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("Summarize {text} as JSON like {\"summary\": ...}")
    msgs = PromptTemplate.from_file(tmp_path / "t.txt").messages("DOC")
    assert msgs == [{"role": "user", "content": "Summarize DOC as JSON like {\"summary\": ...}"}]
    assert [m["role"] for m in DEFAULT_TEMPLATE.messages("DOC")] == ["system", "user"]
    assert DEFAULT_TEMPLATE.messages("DOC")[1]["content"].endswith("---\nDOC")
    with pytest.raises(ValueError, match="placeholder"):
        PromptTemplate("no placeholder")


def test_a_signal_inside_a_deferred_block_is_raised_when_it_ends() -> None:
    done = []
    before = signal.getsignal(signal.SIGTERM)
    with Interrupts() as interrupts, pytest.raises(JobInterrupted) as caught, interrupts.deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        done.append("write finished")
    assert done == ["write finished"] and caught.value.exit_status == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before  # restored


# ---- speedup estimates and the report -----------------------------------------------------------


def test_speedup_is_measured_against_the_plain_sample_of_the_same_run() -> None:
    steady = tuple(0.040 + 0.001 * (i % 3) for i in range(99))  # plain steps within a few percent
    sample = PlainSample("d0", decode_tokens=99, decode_s=3.96, step_s=steady)
    figure = measure_speedup([sample], decode_tokens=990, decode_s=16.5)
    assert figure is not None and figure.speedup == pytest.approx(990 * (3.96 / 99) / 16.5)  # 2.40x
    assert figure.unreliable is None
    assert "1 document ('d0') decoded again without speculation" in figure.how
    assert "990 decode tokens took 16.50 s with speculation, 39.60 s at the plain rate" in figure.how
    assert measure_speedup([], 990, 16.5) is None  # no sample: no figure, rather than a guess
    assert measure_speedup([PlainSample("d0", 0, 0.0)], 990, 16.5) is None


def test_a_wide_spread_of_plain_step_times_marks_the_figure_unreliable() -> None:
    busy = tuple(0.030 if i % 2 else 0.085 for i in range(60))  # another process shares the cores
    assert step_spread(busy) == pytest.approx((0.030, 0.0575, 0.085))
    figure = measure_speedup([PlainSample("d0", 60, 3.45, busy)], 600, 12.0)
    assert figure is not None and figure.unreliable is not None
    assert "30.0-85.0 ms" in figure.unreliable and "quiet machine" in figure.unreliable
    assert step_spread(busy[:7]) is None  # too few steps to tell


def test_a_document_decoded_under_another_load_than_the_sample_marks_the_figure_unreliable() -> None:
    steady = tuple([0.035] * 47)  # the plain sample ran in a quiet moment ...
    sample = PlainSample("backups", 47, 1.645, steady)
    # ... but a load spike made one document's 5 speculative steps take 1.15 s each (seen on a shared
    # machine: the run reported 0.63x); the others took 1.1-1.6x a plain step, as they should
    steps = [("keys", 5.76 / 5), ("backups", 0.167 / 3), ("oncall", 1.57 / 40)]
    figure = measure_speedup([sample], 141, 7.5, steps)
    assert figure is not None and figure.unreliable is not None
    assert "1 of 3 documents' speculative steps took outside 0.5-6x a plain step ('keys': 32.9x)" \
        in figure.unreliable
    calm = measure_speedup([sample], 141, 1.9, steps[1:])
    assert calm is not None and calm.unreliable is None


def _record(i: int, tokens: int = 40, steps: int = 20, drafts: int = 30, accepted: int = 19) -> dict:
    return {"id": f"d{i}", "summary": "s", "finish_reason": "length",
            "usage": {"prompt_tokens": 100, "completion_tokens": tokens, "total_tokens": 100 + tokens},
            "speculation": {"steps": steps, "draft_tokens": drafts, "accepted_tokens": accepted,
                            "acceptance_length": (accepted + steps) / steps,
                            "accepted_tokens_by_source": {"context": accepted}},
            "timings": {"total_s": 1.0, "first_token_s": 0.2, "decode_s": 0.8, "tokens_per_second": 40.0}}


def test_report_lines(tmp_path: Path) -> None:
    report = JobReport()
    for i in range(3):
        report.add(_record(i))
    report.failures.append(("bad-doc", "ValueError: too long"))
    report.skipped_done = 2
    no_sample = report.text()
    report.plain_samples.append(PlainSample("d0", 39, 1.56, tuple([0.040] * 39)))
    text = report.text()
    lines = text.splitlines()
    assert lines[0].startswith("documents: 3 summarized in ") and "1 failed" in lines[0]
    assert "2 already in the output" in lines[0]
    assert lines[1].startswith("tokens: 300 prompt, 120 completion")
    assert lines[2] == ("speculation: 60 steps, acceptance length 1.95; draft tokens 90, accepted 57 "
                        "(63.3%); accepted by source: context 100.0%")
    # one figure, with its method: 117 decode tokens at the sample's 40 ms vs 3 x 0.8 s measured
    assert lines[3].startswith("speedup vs plain decoding: 1.95x [measured: 1 document ('d0') decoded again")
    assert lines[4] == "failed: bad-doc: ValueError: too long"
    assert sum("speedup" in line for line in lines) == 1
    assert "speedup vs plain decoding: not measured" in no_sample
    assert report.postfix()["AL"] == "1.95"
    png = report.plot(tmp_path / "chart.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_report_totals_the_whole_output_file_when_it_held_earlier_results() -> None:
    report = JobReport()
    report.skipped_done = 2
    earlier = [_record(0), _record(1)]
    text = report.text(earlier, "out.jsonl")
    assert text.splitlines()[0].startswith("documents: 0 summarized in ")
    assert text.splitlines()[1] == ("output: 2 documents in out.jsonl, 80 completion tokens; speculation: "
                                    "40 steps, acceptance length 1.95; draft tokens 60, accepted 38 (63.3%); "
                                    "accepted by source: context 100.0%")


# ---- the real CLI -------------------------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.mark.slow
def test_cli_skips_bad_lines_and_failing_documents_and_signals_them(tiny_model: Path, tmp_path: Path,
                                                                   home: Path) -> None:
    rows: list[object] = [{"id": f"doc-{i}", "text": _text(i)} for i in range(3)]
    rows.insert(2, '{"id": "broken", "text": ')
    rows.insert(1, {"id": "too-long", "text": "word " * 3000})  # past the tiny model's 2048-token window
    src = _write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    proc = _cli(src, "-o", out, "--model", tiny_model, "--max-tokens", "8", home=home)
    assert proc.returncode == 1, proc.stderr
    assert f"{src}:4: not JSON" in proc.stderr
    assert sorted(r["id"] for r in _records(out)) == ["doc-0", "doc-1", "doc-2"]  # in finishing order
    assert "1 failed; 1 bad input entries skipped" in proc.stdout
    # a 400, as from a gateway
    assert "failed: too-long: ClientError: this model's maximum context length" in proc.stdout

    strict = _cli(src, "-o", tmp_path / "strict.jsonl", "--model", tiny_model, "--strict", home=home)
    assert strict.returncode == 2 and "--strict" in strict.stderr and f"{src}:4:" in strict.stderr
    assert _records(tmp_path / "strict.jsonl") == []


@pytest.mark.slow
def test_cli_summarizes_a_directory_into_a_collection_with_report_and_plot(tiny_model: Path, tmp_path: Path,
                                                                         home: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.txt").write_text(_text(1))
    (docs / "sub" / "b.md").write_text(_text(2))
    (docs / "notes.json").write_text("{}")
    out, png = tmp_path / "out.jsonl", tmp_path / "chart.png"
    proc = _cli(docs, "-o", out, "--model", tiny_model, "--max-tokens", "12", "--collection", "inputs",
                "--plot", png, home=home)
    assert proc.returncode == 0, proc.stderr
    assert "indexed 2 input documents into the in-process collection 'inputs'" in proc.stderr
    records = _records(out)
    assert sorted(r["id"] for r in records) == ["a.txt", "sub/b.md"]
    for r in records:
        assert set(r) >= {"id", "summary", "usage", "speculation", "timings", "finish_reason"}
        assert r["usage"]["completion_tokens"] == 12 and r["speculation"]["steps"] >= 1
        assert set(r["timings"]) == {"total_s", "first_token_s", "decode_s", "tokens_per_second",
                                     "decode_window"}
        start, end = r["timings"]["decode_window"]
        assert end - start == pytest.approx(r["timings"]["decode_s"], abs=1e-3)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("documents: 2 summarized in ")
    assert lines[1].startswith("tokens: ") and lines[2].startswith("speculation: ")
    assert lines[3].startswith("speedup vs plain decoding: ")
    assert "decoded again without speculation" in lines[3]
    assert sum("speedup" in line for line in lines) == 1
    assert lines[-1] == f"plot: {png}" and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_cli_resumes_and_repairs_a_torn_last_line(tiny_model: Path, tmp_path: Path, home: Path) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", [{"id": f"doc-{i}", "text": _text(i)} for i in range(5)])
    out = tmp_path / "out.jsonl"
    first = _cli(src, "-o", out, "--model", tiny_model, "--max-tokens", "8", "--limit", "2", home=home)
    assert first.returncode == 0, first.stderr
    assert sorted(r["id"] for r in _records(out)) == ["doc-0", "doc-1"]
    with open(out, "a") as f:
        f.write('{"id": "doc-2", "summary": "half a li')  # a write cut short by a crash
    second = _cli(src, "-o", out, "--model", tiny_model, "--max-tokens", "8", home=home)
    assert second.returncode == 0, second.stderr
    assert "cut off a torn last line" in second.stderr
    assert "2 already in the output" in second.stdout
    ids = [r["id"] for r in _records(out)]  # in finishing order: documents run 4 at a time
    assert sorted(ids[:2]) == ["doc-0", "doc-1"] and sorted(ids) == [f"doc-{i}" for i in range(5)]
    third = _cli(src, "-o", out, "--model", tiny_model, home=home)  # nothing left: no model load
    assert third.returncode == 0 and "documents: 0 summarized" in third.stdout
    assert "5 already in the output" in third.stdout and len(_records(out)) == 5


def test_plot_without_matplotlib_fails_before_the_job_starts_with_the_install_hint(tmp_path: Path,
                                                                                   home: Path) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": _text(0)}])
    out = tmp_path / "out.jsonl"
    # a Python where `import matplotlib` fails, as in the default install
    blocked = ("import sys; sys.modules['matplotlib'] = None; from lookupspec.cli import main; "
               "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", blocked, "summarize", str(src), "-o", str(out),
                           "--model", "./no-such-model", "--plot", str(tmp_path / "chart.png")],
                          env=_env(home), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--plot needs matplotlib, which is not installed: pip install matplotlib" in proc.stderr
    assert "loading model" not in proc.stderr and not out.exists()  # nothing started


def test_a_rerun_with_nothing_left_still_writes_the_plot_and_the_report(tmp_path: Path, home: Path) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", [{"id": f"d{i}", "text": _text(i)} for i in range(3)])
    out, png = tmp_path / "out.jsonl", tmp_path / "chart.png"
    _write_jsonl(out, [_record(i) for i in range(3)])  # an earlier run finished them, then its plot failed
    proc = _cli(src, "-o", out, "--model", "./no-such-model", "--plot", png, home=home)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "documents: 0 summarized" in lines[0] and "3 already in the output" in lines[0]
    assert lines[1].startswith(f"output: 3 documents in {out}, 120 completion tokens; speculation: 60 steps")
    assert lines[-1] == f"plot: {png}" and png.read_bytes()[:4] == b"\x89PNG"
    assert "loading model" not in proc.stderr


def _start_and_wait_for_output(src: Path, out: Path, tiny_model: Path, home: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(_command(src, "-o", out, "--model", tiny_model, "--max-tokens", "48"),
                            env=_env(home), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 240
    while not (out.exists() and out.read_bytes().count(b"\n") >= 1):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no output line in time"
        time.sleep(0.05)
    return proc


@pytest.mark.slow
def test_kill_9_mid_run_leaves_a_file_whose_rerun_completes_the_rest(tiny_model: Path, tmp_path: Path,
                                                                     home: Path) -> None:
    n = 12
    src = _write_jsonl(tmp_path / "in.jsonl", [{"id": f"doc-{i}", "text": _text(i)} for i in range(n)])
    out = tmp_path / "out.jsonl"
    proc = _start_and_wait_for_output(src, out, tiny_model, home)
    proc.kill()
    proc.communicate()
    data = out.read_bytes()
    complete = data[:data.rfind(b"\n") + 1]
    done = [json.loads(line)["id"] for line in complete.decode().splitlines()]
    assert 1 <= len(done) < n, "the kill should land mid-run"
    rerun = _cli(src, "-o", out, "--model", tiny_model, "--max-tokens", "48", home=home)
    assert rerun.returncode == 0, rerun.stderr
    ids = [r["id"] for r in _records(out)]
    assert sorted(ids) == sorted(f"doc-{i}" for i in range(n)) and len(ids) == n
    assert ids[:len(done)] == done


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_run_exits_128_plus_signum_with_a_valid_file(tiny_model: Path, tmp_path: Path,
                                                                  home: Path, sig: signal.Signals) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", [{"id": f"doc-{i}", "text": _text(i)} for i in range(30)])
    out = tmp_path / "out.jsonl"
    proc = _start_and_wait_for_output(src, out, tiny_model, home)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, stderr
    assert f"interrupted by {sig.name}" in stdout and "run the same command again to resume" in stdout
    records = _records(out)
    assert 1 <= len(records) < 30 and len({r["id"] for r in records}) == len(records)


@pytest.mark.slow
def test_gateway_mode_gives_the_in_process_summaries(tiny_model: Path, tiny_gateway, tmp_path: Path,
                                                     home: Path) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", [{"id": f"doc-{i}", "text": _text(i)} for i in range(6)])
    local, remote = tmp_path / "local.jsonl", tmp_path / "remote.jsonl"
    a = _cli(src, "-o", local, "--model", tiny_model, "--max-tokens", "24", home=home)
    b = _cli(src, "-o", remote, "--gateway", tiny_gateway.url, "--concurrency", "2", "--max-tokens", "24",
             home=home)
    assert a.returncode == 0, a.stderr
    assert b.returncode == 0, b.stderr
    here = {r["id"]: r for r in _records(local)}
    there = {r["id"]: r for r in _records(remote)}
    assert set(here) == set(there) == {f"doc-{i}" for i in range(6)}
    for doc_id, r in here.items():
        assert r["summary"] and there[doc_id]["summary"] == r["summary"]
        counts = ("prompt_tokens", "completion_tokens", "total_tokens")
        assert {k: there[doc_id]["usage"][k] for k in counts} == {k: r["usage"][k] for k in counts}
    # the gateway's prefix cache served the summarize template's shared start to the later documents
    assert any(r["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 for r in there.values())
    assert "speedup vs plain decoding" in b.stdout

    missing = _cli(src, "-o", tmp_path / "x.jsonl", "--gateway", tiny_gateway.url, "--collection", "nope",
                   home=home)
    assert missing.returncode == 2 and "nope" in missing.stderr
    assert _records(tmp_path / "x.jsonl") == []


def test_decode_wall_time_is_the_union_of_the_windows() -> None:
    from lookupspec.summarize.speedup import decode_wall_time

    assert decode_wall_time([[0, 2], [1, 3], [5, 6]]) == 4
    assert decode_wall_time([[0, 10], [2, 3]]) == 10
    assert decode_wall_time([]) == 0


def test_json_schema_gives_structured_summaries_that_validate(tmp_path: Path, tiny_model: Path) -> None:
    """--json-schema FILE: every finished summary parses and follows the schema ("data" holds it)."""
    schema = {"type": "object", "properties": {"topic": {"enum": ["cats", "dogs", "other"]},
                                               "score": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["topic", "score"], "additionalProperties": False}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"id": f"d{i}", "text": f"Document {i} about cats."}) + "\n"
                           for i in range(3)))
    out = tmp_path / "out.jsonl"
    proc = _cli(src, "-o", out, "--model", tiny_model, "--max-tokens", "40", "--json-schema",
                tmp_path / "schema.json", "--plain-sample", "0", home=tmp_path / "home")
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 3
    for r in records:
        assert r["finish_reason"] == "stop", r
        assert r["data"] == json.loads(r["summary"])
        assert r["data"]["topic"] in ("cats", "dogs", "other") and 0 <= r["data"]["score"] <= 9
    bad = _cli(src, "-o", tmp_path / "o2.jsonl", "--model", tiny_model, "--json-schema",
               tmp_path / "nope.json", home=tmp_path / "home")
    assert bad.returncode == 2 and "--json-schema" in bad.stderr
