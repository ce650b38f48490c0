"""The prepared GPU check (scripts/gpu-check.sh, scripts/gpu_check.py) runs end to end on the CPU in its
dry-run mode: tiny shapes of the shipped configs, every figure and exactness section in the JSON,
the graph path reported as skipped with its reason, the static step's tokens equal to today's. The
shipped configs are the real architectures' shapes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(result: dict, models: list[str]) -> None:
    assert result["dry_run"] and result["device"] == "cpu"
    assert set(result["models"]) == set(models)
    for m in result["models"].values():
        assert "error" not in m, m
        assert m["floor_ms"] > 0 and m["weight_bytes"] > 0
        assert set(m["figures"]) == {"decode_1seq", "tree16_1seq", "batch8x8"}
        for row in m["figures"].values():
            assert row["todays_eager"]["median_ms"] > 0 and row["static_eager"]["median_ms"] > 0
            assert "need a CUDA device" in row["static_graph"]["skipped"]
    for e in result.get("exactness", {}).values():
        assert e["graph_vs_eager"]["identical_rows"] == e["rows"] > 0
        assert e["static_vs_todays"]["other_differences"] == 0
    engine = result.get("engine")
    if engine is not None:  # the dry run runs the static step eagerly, the bucket budget with it
        assert "error" not in engine, engine
        assert engine["static_step"] and not engine["graphs"]
        for key, seqs in (("plain_1seq", 1), ("plain_8seq", 8), ("spec_1seq", 1), ("spec_8seq", 8)):
            f = engine[key]
            # the decode steps' tokens: the prefill gives each sequence its first
            assert f["tokens"] == seqs * (engine["new_tokens"] - 1) and f["tokens_per_s"] > 0
            assert f["rows_per_step"] is not None and f["rows_per_step"] <= f["bucket_rows_per_step"]
        assert engine["plain_1seq"]["steps"] == engine["new_tokens"] - 1
        assert engine["spec_8seq"]["rows_per_step"] > 8  # drafts were verified in the steps


def test_the_dry_run_writes_every_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gpu-check.json"
    code = _gpu_check().main(["--dry-run", "--models", "smollm2-135m", "--iters", "1", "--warmup", "0",
                              "--exact-steps", "1", "--out", str(out)])
    assert code == 0
    _check(json.loads(out.read_text()), ["smollm2-135m"])
    printed = capsys.readouterr().out
    assert "HBM floor" in printed and "exactness float32" in printed and "exactness bfloat16" in printed
    assert "engine (static step True" in printed


def test_the_shipped_configs_are_the_real_shapes() -> None:
    from transformers import AutoConfig

    expected = {"smollm2-135m": (30, 576, 9, 3, 49152), "llama-3.2-1b": (16, 2048, 32, 8, 128256),
                "llama-3.1-8b": (32, 4096, 32, 8, 128256)}
    gpu_check = _gpu_check()
    assert tuple(expected) == gpu_check.MODELS
    for name, shape in expected.items():
        cfg = AutoConfig.from_pretrained(str(ROOT / "fixtures" / "gpu-configs" / f"{name}.json"))
        assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                cfg.vocab_size) == shape
    assert gpu_check.bandwidth.__doc__


@pytest.mark.slow
def test_the_shell_script_runs_the_dry_run(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    argv = ["--dry-run", "--models", "llama-3.2-1b", "--iters", "1", "--warmup", "0", "--exact-model", ""]
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), *argv], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "== versions" in proc.stdout and "== CUDA tests" not in proc.stdout
    result = json.loads((tmp_path / "gpu-check.json").read_text())
    _check(result, ["llama-3.2-1b"])
    assert "exactness" not in result  # --exact-model "" skips it
