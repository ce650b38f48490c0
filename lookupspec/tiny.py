"""Tiny random models built from the configs in ``fixtures/models/`` (tests and demos; no downloads).

``build_tiny_model("tiny-llama", out_dir, seed=0)`` seeds torch, instantiates the architecture from
its config with random weights, and saves an ordinary Hugging Face directory (weights + the fixture
tokenizer), so every other code path loads it exactly like a real model. The same seed always gives the
same weights. The configs use a large ``initializer_range`` so that logits are spread out: with the
default 0.02 a random model's logits are nearly flat and greedy decoding would sit on float near-ties.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BASIC_MODELS", "FIXTURES", "TINY_MODELS", "build_tiny_model"]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TINY_MODELS = ("tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-gemma2", "tiny-gemma3")
# the two Llama-shaped families most tests run on; mistral (one sliding window for every layer),
# gemma2 (sliding and full layers alternating, soft-capped attention logits) and gemma3 (five sliding
# layers to one full one in the real models; three to one here) test sliding windows
BASIC_MODELS = ("tiny-llama", "tiny-qwen2")


def build_tiny_model(name: str, out_dir: Path, *, seed: int = 0, fixtures: Path = FIXTURES) -> Path:
    """Build ``fixtures/models/<name>`` with random weights from ``seed`` into ``out_dir`` (replacing
    whatever is there), with the fixture tokenizer: ``lookupspec random-model``'s build, silently."""
    from lookupspec.random_model import build_random_model

    config = fixtures / "models" / name / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"no tiny model config at {config.parent}")
    return build_random_model(str(config), Path(out_dir), seed=seed, tokenizer=fixtures / "tokenizer",
                              force=True, log=lambda _: None)
