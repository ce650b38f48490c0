"""The `lookupspec generate` command streams text from a real process."""

from __future__ import annotations

import subprocess
import sys

import pytest
from reference import complete


def _run(*args, prefix=True, **kw):
    """`python -m lookupspec.cli ARGS`, or `python ARGS` with prefix=False."""
    cmd = [sys.executable, *(("-m", "lookupspec.cli") if prefix else ()), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)


def test_generate_streams_text_and_reports_finish_reason(tiny_models):
    from lookupspec.text import TextEngine

    model = str(tiny_models["tiny-llama"])
    te = TextEngine.load(model)
    expected = complete(te, messages=[{"role": "user", "content": "Summarize: json"}], max_tokens=12).text
    proc = _run("-X", "importtime", "-m", "lookupspec.cli", "generate", "--model", model, "--chat",
                "--max-tokens", "12", "Summarize: json", prefix=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected + "\n"  # only the text: the progress lines go to stderr
    assert "[finish_reason:" in proc.stderr
    # seconds of torch import and model loading are announced before they start
    assert _said_before_torch(proc.stderr, f"loading model {model} ..."), proc.stderr[-3000:]


def test_generate_with_missing_model_is_a_clear_error():
    proc = _run("generate", "--model", "./nope", "hi")
    assert proc.returncode == 2
    assert "error: model path './nope' does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_generate_rejects_bad_max_tokens():
    proc = _run("generate", "--max-tokens", "0", "hi")
    assert proc.returncode == 2
    assert "must be >= 1" in proc.stderr


def test_generate_without_lean_forward_or_packed_layers_gives_the_same_text(tiny_models):
    import os

    from lookupspec.text import TextEngine

    model = str(tiny_models["tiny-qwen2"])
    assert TextEngine.load(model).engine.lean is not None
    assert TextEngine.load(model, lean_forward=False).engine.lean is None
    runs = [
        _run("generate", "--model", model, "--max-tokens", "16", "def add(a, b):"),
        _run("generate", "--model", model, "--max-tokens", "16", "--no-lean-forward", "--no-packed-linear",
             "def add(a, b):"),
        _run("generate", "--model", model, "--max-tokens", "16", "def add(a, b):",
             env={**os.environ, "LOOKUPSPEC_LEAN_FORWARD": "0"}),
    ]
    assert all(p.returncode == 0 for p in runs), [p.stderr for p in runs]
    assert runs[0].stdout == runs[1].stdout == runs[2].stdout != ""
    help_text = _run("generate", "--help").stdout
    assert "--no-lean-forward" in help_text and "LOOKUPSPEC_LEAN_FORWARD" in help_text


def test_generate_serves_a_model_that_mixes_sliding_window_and_full_attention_layers(tiny_models):
    """Gemma 3 (and every configuration mixing sliding-window and full layers) generates past its
    window, drafts included, instead of stopping with "sliding-window attention layers are not
    supported"."""
    from lookupspec.text import TextEngine

    model = str(tiny_models["tiny-gemma3"])
    prompt = "def parse(argv):\n    parser = argparse.ArgumentParser()\n" * 3  # past the window of 12
    expected = complete(TextEngine.load(model), prompt=prompt, max_tokens=40).text
    proc = _run("generate", "--model", model, "--max-tokens", "40", "-v", prompt)
    assert proc.returncode == 0, proc.stderr
    assert "not supported" not in proc.stderr
    assert proc.stdout == expected + "\n"


def test_version_prints_the_package_version_without_importing_torch():
    import tomllib
    from pathlib import Path

    import lookupspec

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert lookupspec.__version__ == pyproject["project"]["version"]
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "lookupspec.cli", "--version"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"lookupspec {lookupspec.__version__}\n"
    assert not [line for line in proc.stderr.splitlines() if _imports_torch(line)]


def _imports_torch(line: str) -> bool:
    """An `-X importtime` line for the top-level torch package ("import time: 1 | 2 |   torch")."""
    return line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() == "torch"


def _said_before_torch(stderr: str, message: str) -> bool:
    """Whether ``message`` starts a stderr line before `-X importtime` reports torch's import."""
    lines = stderr.splitlines()
    said = next((i for i, line in enumerate(lines) if line.startswith(message)), None)
    torch = next((i for i, line in enumerate(lines) if _imports_torch(line)), None)
    return said is not None and torch is not None and said < torch


def test_summarize_says_it_is_loading_the_model_first_on_stderr(tiny_models, tmp_path):
    model = str(tiny_models["tiny-llama"])
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "The river near the bridge was built in 1800."}\n')
    proc = _run("-X", "importtime", "-m", "lookupspec.cli", "summarize", str(src), "-o",
                str(tmp_path / "out.jsonl"), "--model", model, "--max-tokens", "4", prefix=False)
    assert proc.returncode == 0, proc.stderr
    assert _said_before_torch(proc.stderr, f"loading model {model} ..."), proc.stderr[-3000:]
    assert "loading" not in proc.stdout  # stdout is the report


def test_a_backslash_n_stop_string_gets_a_note_on_quoting():
    proc = _run("generate", "--model", "./nope", "--stop", "\\n\\n", "hi")
    assert proc.returncode == 2
    assert "note: --stop '\\\\n\\\\n' is a backslash and an n, not a newline" in proc.stderr
    assert "$'\\n'" in proc.stderr


@pytest.mark.parametrize("command", [["bench", "--limit", "1"], ["bench-serve", "--concurrency", "1"]])
def test_benchmark_plots_without_matplotlib_fail_before_anything_runs(command, tmp_path):
    """A long benchmark must not end in an ImportError: --plot is checked before it starts."""
    blocked = ("import sys; sys.modules['matplotlib'] = None; from lookupspec.cli import main; "
               "sys.exit(main(sys.argv[1:]))")
    argv = [*command, "--model", str(tmp_path / "no-model"), "--plot", str(tmp_path / "chart.png")]
    proc = subprocess.run([sys.executable, "-c", blocked, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--plot needs matplotlib, which is not installed: pip install matplotlib" in proc.stderr
    assert "loading" not in proc.stderr and "starting" not in proc.stderr
