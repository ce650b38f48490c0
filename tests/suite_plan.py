"""How `make test` spreads the suite over its pytest-xdist workers (used by tests/conftest.py).

Threads: each worker runs torch on its share of the cores, and so do the servers and commands the
tests start (they inherit ``OMP_NUM_THREADS``). Two workers of two threads each on two cores spent
their time waiting on each other: side by side on a 2-core machine, four of the slowest files
took 289 and 334 s that way against 188 and 176 s with one thread a worker. An ``OMP_NUM_THREADS``
of the caller's own is kept. Tests of the thread count itself (the native CPU kernels, the served
forward) set their threads explicitly.

Order: the workers take whole files (``--dist loadfile``) in collection order, so a long file
collected late would run alone at the end while the other worker idles. The slow files are
collected first and the quick ones fill the end."""

from __future__ import annotations

import os

# Files over ~15 s, slowest first: seconds each took in `make test` (two workers of one thread) on a
# 2-core machine. An ordering hint only; every file runs either way.
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
    "tools/test_bench_prefix.py",  # ~28
    "kernels/test_verify_kernels.py",  # ~28
    "gateway/test_gateway_redis_outage.py",  # ~28
    "tools/test_batched_replay.py",  # ~23
    "engine/test_device_discipline.py",  # ~22
    "gateway/test_gateway_api.py",  # ~22
    "tools/test_replay.py",  # ~19
    "clients/test_client.py",  # ~18
    "gateway/test_gateway_hostile.py",  # ~17
    "runtime/test_lean.py",  # ~17
    "clients/test_rag_example.py",  # ~16
)


CALLER_THREADS = os.environ.get("OMP_NUM_THREADS")  # as this process found it


def xdist_workers() -> int:
    """The number of pytest-xdist workers of this run (1 without xdist)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def worker_threads(workers: int) -> int:
    """A worker's share of the cores."""
    return max(1, cores() // workers)


def share_the_cores(workers: int) -> None:
    """Give this worker (and what it starts) its share, unless the caller set OMP_NUM_THREADS."""
    os.environ.setdefault("OMP_NUM_THREADS", str(worker_threads(workers)))
