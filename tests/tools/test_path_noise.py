"""bench-batch's noise section: a position's logits across the runtime's forward paths."""

from __future__ import annotations

import random

import pytest
import torch

from tools.path_noise import PATHS, dtype_step, dtype_steps, noise_epsilon, path_noise


def _prompts(n: int = 3, length: int = 40) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(5, 200) for _ in range(length)] for _ in range(n)]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-gemma3", "tiny-gemma2"])
def test_on_the_cpu_in_float32_every_path_gives_the_one_row_bits(tiny_models, name):
    """Sliding windows (Mistral, Gemma 2 and 3) and soft-capped scores (Gemma 2) included."""
    from lookupspec.text import TextEngine

    runner = TextEngine.load(str(tiny_models[name])).engine.runner
    rows = path_noise(runner, _prompts(), rows=(3, 9), neighbours=3)
    assert {(r["path"], r["chain"]) for r in rows} == {(p, k) for p in PATHS for k in (3, 9)}
    for r in rows:
        assert r["rows"] == (3 if r["path"] == "prefill" else 3 * r["chain"])
        assert r["identical_rows"] == r["argmax_agree"] == r["rows"], r
        assert r["max_abs"] == r["max_dtype_steps"] == 0.0
    assert noise_epsilon(rows, 1e-3) == 1e-3
    assert runner.pool.in_use() == 0  # every slot given back


def test_a_path_that_moves_the_logits_is_measured(tiny_models, monkeypatch):
    """Multi-row forwards shifted by a known amount (as another kernel's rounding would move them):
    the chain, tree and batched paths report it, the one-row reference does not move."""
    from lookupspec.text import TextEngine

    runner = TextEngine.load(str(tiny_models["tiny-llama"])).engine.runner
    forward = runner.forward

    def shifted(seqs, keep=None):
        out = forward(seqs, keep)
        return out + 0.25 if sum(len(s.tokens) for s in seqs) > 1 else out

    monkeypatch.setattr(runner, "forward", shifted)
    rows = {r["path"]: r for r in path_noise(runner, _prompts(2), rows=(4,), neighbours=2)}
    for path in ("chain", "tree", "batched"):
        assert rows[path]["identical_rows"] == 0 and rows[path]["argmax_agree"] == 8
        assert rows[path]["max_abs"] == pytest.approx(0.25, abs=1e-5)
    assert rows["prefill"]["max_abs"] == 0.0  # prefill is its own forward, not the shifted one
    assert noise_epsilon(list(rows.values()), 1e-3) == pytest.approx(0.5, abs=2e-5)


def test_dtype_steps_are_taken_at_each_rows_largest_logit():
    ref = torch.tensor([[25.0, -3.0, 0.001], [0.5, 0.25, -0.75]])
    other = ref.clone()
    other[0, 2] += 0.25  # a small logit moved by two bfloat16 steps of the row's top (0.125)
    other[1, 0] += 2.0 ** -9  # float32 steps at 0.75: 2**-24 each
    assert dtype_steps(ref, other, torch.bfloat16).tolist() == pytest.approx([2.0, 0.5])
    assert dtype_steps(ref, other, torch.float32)[1].item() == 2.0 ** 15
    assert dtype_step(25.0, torch.bfloat16) == 0.125


def test_a_margin_in_dtype_steps_uses_the_spacing_at_the_logits_size():
    assert dtype_step(25.0, torch.bfloat16) == 0.125 == dtype_step(-31.9, torch.bfloat16)
    assert dtype_step(32.0, torch.bfloat16) == 0.25
    assert dtype_step(1.5, torch.float32) == 2.0 ** -23
    assert dtype_step(3.0, torch.float16) == 2.0 ** -9
    for dtype in (torch.bfloat16, torch.float16, torch.float32):  # the step is the distance to the next value
        for x in (0.3, 7.0, 25.0, 1000.0):
            t, up = torch.tensor(x, dtype=dtype), torch.tensor(float("inf"), dtype=dtype)
            assert float(torch.nextafter(t, up) - t) == dtype_step(x, dtype)
    assert 0 < dtype_step(0.0, torch.bfloat16) < 1e-30
