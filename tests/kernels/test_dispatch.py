"""The dispatcher (Triton on CUDA, twins elsewhere, overrides), the package surface, and the
`python -m tools bench-kernels` command."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lookupspec.kernels as kernels
import pytest
import torch
from lookupspec.kernels import BACKEND_ENV, pack_requests, reference, resolve_backend, verify_batch

from lookupspec.sampling import SamplingParams


def test_public_names_are_exported():
    for name in kernels.__all__:
        assert getattr(kernels, name) is not None


def test_auto_uses_the_twins_off_cuda(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert resolve_backend("cpu") == "torch"
    assert resolve_backend(torch.device("cpu"), "auto") == "torch"


def test_overrides(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(BACKEND_ENV, "triton")
    assert resolve_backend("cpu") == "triton"
    assert resolve_backend("cpu", "torch") == "torch"  # the argument beats the environment
    monkeypatch.setenv(BACKEND_ENV, "torch")
    assert resolve_backend("cpu") == "torch"
    with pytest.raises(ValueError, match="backend"):
        resolve_backend("cpu", "cuda")


def test_triton_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        resolve_backend("cpu", "triton")


def test_pack_requests_layout():
    batch = pack_requests([([5, 6], [-1, 0]), ([], [])], [SamplingParams(), SamplingParams(0.5, 3, 0.9, 7)],
                          [10, 20])
    assert batch.row_offsets.tolist() == [0, 3, 4]
    assert batch.tokens.tolist() == [5, 6] and batch.parents.tolist() == [-1, 0]
    assert batch.temperature.tolist() == [0.0, 0.5] and batch.top_k.tolist() == [0, 3]
    assert batch.seed.tolist() == [0, 7] and batch.root_position.tolist() == [10, 20]
    assert batch.max_nodes == 2
    with pytest.raises(ValueError, match="seed"):
        pack_requests([([], [])], [SamplingParams(temperature=1.0)], [0])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_dispatch_reaches_both_implementations(backend: str, device: torch.device):
    pytest.importorskip("triton")
    logits = torch.randn(5, 40, device=device)
    batch = pack_requests([([int(logits[0].argmax()), 3], [-1, 0]), ([1], [-1])],
                          [SamplingParams(), SamplingParams(0.9, seed=4)], [3, 8], device=device)
    out = verify_batch(logits, **batch._asdict(), mode="match", backend=backend)
    ref = reference.verify_batch(logits, **batch._asdict(), mode="match")
    assert all(torch.equal(a, b) for a, b in zip(out, ref, strict=True))
    assert out.num_accepted[0] >= 1


def test_the_torch_path_never_imports_triton():
    code = textwrap.dedent("""
        import sys, torch
        from lookupspec.kernels import compact_kv, pack_requests, tree_mask, verify_batch
        from lookupspec.sampling import SamplingParams
        batch = pack_requests([([1, 2], [-1, 0])], [SamplingParams(1.0, seed=1)], [4])
        out = verify_batch(torch.randn(3, 16), **batch._asdict(), mode="match")
        mask, pos = tree_mask(torch.tensor([-1, 0]), 4, torch.float32)
        compact_kv(torch.zeros(1, 1, 8, 4), out.accepted, out.num_accepted, 5)
        assert "triton" not in sys.modules, "triton was imported"
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", BACKEND_ENV)}
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def _bench_args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    from tools import kernels as bench

    parser = argparse.ArgumentParser()
    bench.configure(parser)
    return parser.parse_args(["--json", str(tmp_path / "out.json"), *argv])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_bench_kernels_without_a_gpu_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from tools import kernels as bench

    assert bench.run(_bench_args(tmp_path)) == 0
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert not (tmp_path / "out.json").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_bench_kernels_quick_on_a_gpu(tmp_path: Path):
    from tools import kernels as bench

    assert bench.run(_bench_args(tmp_path, "--quick")) == 0
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["kernels"] and all(row["identical"] for row in result["kernels"])
    assert result["decode_step"]
