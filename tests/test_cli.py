"""The `lookupspec generate` command streams text from a real process."""

from __future__ import annotations

import subprocess
import sys


def _run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "lookupspec.cli", *args], capture_output=True, text=True,
                          timeout=300, **kw)


def test_generate_streams_text_and_reports_finish_reason(tiny_models):
    from lookupspec.text import TextEngine

    te = TextEngine.load(str(tiny_models["tiny-llama"]))
    expected = te.complete(messages=[{"role": "user", "content": "Summarize: json"}], max_tokens=12).text
    proc = _run("generate", "--model", str(tiny_models["tiny-llama"]), "--chat", "--max-tokens", "12",
                "Summarize: json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected + "\n"
    assert "[finish_reason:" in proc.stderr


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
    """Gemma 3 (and every configuration mixing sliding-window and full layers) used to stop with
    "sliding-window attention layers are not supported"; the runtime serves it, drafts included."""
    from lookupspec.text import TextEngine

    model = str(tiny_models["tiny-gemma3"])
    prompt = "def parse(argv):\n    parser = argparse.ArgumentParser()\n" * 3  # past the window of 12
    expected = TextEngine.load(model).complete(prompt=prompt, max_tokens=40).text
    proc = _run("generate", "--model", model, "--max-tokens", "40", "-v", prompt)
    assert proc.returncode == 0, proc.stderr
    assert "not supported" not in proc.stderr
    assert proc.stdout == expected + "\n"
