"""Engine test fixtures: loaded tiny models of both families and a draft model sharing their tokenizer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for scripted.py


@pytest.fixture(scope="session", params=["tiny-llama", "tiny-qwen2"])
def tiny_loaded(request, tiny_models):
    from lookupspec.models import load_model

    return load_model(str(tiny_models[request.param]))


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory):
    """A different random model (seed 1) with the same tokenizer: a draft that is often wrong."""
    from lookupspec.models import load_model
    from lookupspec.tiny import build_tiny_model

    return load_model(str(build_tiny_model("tiny-llama", tmp_path_factory.mktemp("draft") / "d", seed=1)))
