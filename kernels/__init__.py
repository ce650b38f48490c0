"""Verification kernels (Triton) with torch twins and a dispatcher. Installed as lookupspec.kernels.

Importing this package never imports triton: the dispatcher loads the Triton modules only when it
picks them (CUDA tensors, or an explicit override).
"""

from .compact_plan import pool_table
from .dispatch import (
    BACKEND_ENV,
    compact_cache,
    compact_kv,
    compact_pool,
    resolve_backend,
    tree_attention,
    tree_mask,
    verify_batch,
)
from .staging import HostStage, Staged
from .verify_inputs import (
    BatchVerifyOutput,
    RequestBatch,
    StagedRequests,
    VerifyMode,
    pack_requests,
    stage_requests,
)

__all__ = [
    "BACKEND_ENV",
    "BatchVerifyOutput",
    "HostStage",
    "RequestBatch",
    "Staged",
    "StagedRequests",
    "VerifyMode",
    "compact_cache",
    "compact_kv",
    "compact_pool",
    "pack_requests",
    "pool_table",
    "resolve_backend",
    "stage_requests",
    "tree_attention",
    "tree_mask",
    "verify_batch",
]
