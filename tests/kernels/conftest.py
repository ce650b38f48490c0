"""Kernel tests: the Triton kernels run under the interpreter on machines without CUDA.

TRITON_INTERPRET must be in the environment before triton is first imported (tests/conftest.py
sets it for the whole session; this repeats it so that the directory also runs on its own). Nothing
here imports triton: the test modules import the Triton wrappers lazily.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch_threads import torch_threads

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where the kernels run: CUDA when present (compiled kernels), else the CPU (the interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def gen() -> torch.Generator:
    """A generator with a fresh seed per test; failures print it (``gen.initial_seed()``)."""
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(6), "little"))
