"""Verification kernels (Triton) with torch twins and a dispatcher. Installed as lookupspec.kernels.

Importing this package never imports triton: the dispatcher loads the Triton modules only when it
picks them (CUDA tensors, or an explicit override).
"""

from .batch import BatchVerifyOutput, RequestBatch, VerifyMode, pack_requests
from .dispatch import BACKEND_ENV, compact_cache, compact_kv, resolve_backend, tree_mask, verify_batch

__all__ = [
    "BACKEND_ENV",
    "BatchVerifyOutput",
    "RequestBatch",
    "VerifyMode",
    "compact_cache",
    "compact_kv",
    "pack_requests",
    "resolve_backend",
    "tree_mask",
    "verify_batch",
]
