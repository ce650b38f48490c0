"""The test suite's own set-up (tests/conftest.py): the slow-file ordering names files that exist,
and under pytest-xdist each worker runs torch on its share of the cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from conftest import CALLER_THREADS, SLOW_FILES_FIRST, WORKER_THREADS

TESTS = Path(__file__).resolve().parent


def test_the_slow_files_hint_names_existing_test_files_once() -> None:
    assert len(set(SLOW_FILES_FIRST)) == len(SLOW_FILES_FIRST)
    missing = [name for name in SLOW_FILES_FIRST if not (TESTS / name).is_file()]
    assert not missing, f"tests/conftest.py's SLOW_FILES_FIRST names files that do not exist: {missing}"


def test_each_worker_runs_torch_on_its_share_of_the_cores() -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers == 1:
        pytest.skip("one process: torch keeps its own thread count (this checks `make test`'s workers)")
    threads = int(os.environ["OMP_NUM_THREADS"])  # what the commands and servers the tests start inherit
    assert torch.get_num_threads() == threads
    assert threads == (int(CALLER_THREADS) if CALLER_THREADS else WORKER_THREADS)
    if CALLER_THREADS is None:
        assert max(1, len(os.sched_getaffinity(0)) // workers) == WORKER_THREADS
