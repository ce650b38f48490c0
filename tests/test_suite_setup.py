"""The test suite's own set-up (tests/suite_plan.py, tests/conftest.py): the slow-file ordering
names files that exist and holds under pytest-xdist, and each worker runs torch on its share of the
cores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import suite_plan
import torch

TESTS = Path(__file__).resolve().parent


def test_the_slow_files_hint_names_existing_test_files_once() -> None:
    names = suite_plan.SLOW_FILES_FIRST
    assert len(set(names)) == len(names)
    missing = [name for name in names if not (TESTS / name).is_file()]
    assert not missing, f"tests/suite_plan.py's SLOW_FILES_FIRST names files that do not exist: {missing}"


def test_the_collection_puts_the_slow_files_first_and_xdist_keeps_that_order(
        request: pytest.FixtureRequest) -> None:
    if hasattr(request.config.option, "loadscopereorder"):
        assert request.config.option.loadscopereorder is False
    files = []
    for item in request.session.items:
        name = item.path.relative_to(TESTS).as_posix()
        if not files or files[-1] != name:
            files.append(name)
    slow = [f for f in suite_plan.SLOW_FILES_FIRST if f in files]  # a -k or a path may select fewer
    assert files[:len(slow)] == slow


def test_each_worker_runs_torch_on_its_share_of_the_cores() -> None:
    workers = suite_plan.xdist_workers()
    if workers == 1:
        pytest.skip("one process: torch keeps its own thread count (this checks `make test`'s workers)")
    threads = int(os.environ["OMP_NUM_THREADS"])  # what the commands and servers the tests start inherit
    assert torch.get_num_threads() == threads
    want = suite_plan.CALLER_THREADS or max(1, len(os.sched_getaffinity(0)) // workers)
    assert threads == int(want)
