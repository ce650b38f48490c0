"""Static-step tests: tiny shapes, one torch thread (intra-op threads only add synchronisation on
tensors this small, and the machine's cores are shared)."""

from __future__ import annotations

import pytest
from torch_threads import torch_threads


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    with torch_threads(1):
        yield
