"""One torch thread for tests of tiny tensors, where intra-op threads only add synchronisation (tens
of ms per op on a busy 2-core machine): ``with torch_threads(1): yield`` in an autouse fixture."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` inside, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
