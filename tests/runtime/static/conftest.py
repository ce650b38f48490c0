"""Static-step tests: tiny shapes, one torch thread (intra-op threads only add synchronisation on
tensors this small, and the machine's cores are shared)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
