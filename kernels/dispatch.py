"""One entry point per kernel: Triton on CUDA, the torch twin (reference.py) everywhere else.

Override for tests and experiments, strongest first: the ``backend=`` argument, then the
``LOOKUPSPEC_KERNELS`` environment variable; each is ``"auto"`` (the default), ``"triton"`` or
``"torch"``. Triton is imported only when the Triton path is chosen, so CPU deployments never load
it. Forcing ``"triton"`` on CPU tensors needs ``TRITON_INTERPRET=1`` in the environment before
triton is first imported (the tests set it in tests/conftest.py).

How the engine runs one step (request batch of 1; ``root`` is the last accepted token, at position
``P``, not yet in the cache; the cache holds positions ``[0, P)``)::

    ids = [root] + tokens                             # the root is node 0 of the forward
    fwd_parents = [-1] + [p + 1 for p in parents]
    mask, pos = tree_mask(torch.tensor(fwd_parents, device=dev), P, model.dtype)
    out = model(input_ids=torch.tensor([ids], device=dev), attention_mask=mask, position_ids=pos,
                cache=cache)                  # past_key_values= before transformers 5.24
    batch = pack_requests([(tokens, parents)], [params], [P], device=dev)
    res = verify_batch(out.logits[0], **batch._asdict(), mode="match")  # rows: root, then nodes
    compact_cache(cache, res.accepted, res.num_accepted, base=P + 1)     # node 0's cache slot
    step = res.results()[0]                          # the one host sync of the step
    cache.crop(-(len(tokens) - step.num_accepted))   # transformers 5: drop that many entries
    emit(step.emitted(tokens))
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Sequence
from typing import Any, Literal

import torch

from . import reference
from .verify_inputs import BatchVerifyOutput, VerifyMode, check_batch_parents, check_tree_parents

__all__ = ["BACKEND_ENV", "compact_cache", "compact_kv", "compact_pool", "resolve_backend", "tree_attention",
           "tree_mask", "verify_batch"]

BACKEND_ENV = "LOOKUPSPEC_KERNELS"
Backend = Literal["triton", "torch"]


def resolve_backend(device: torch.device | str, backend: str | None = None) -> Backend:
    """The implementation that runs for tensors on ``device``."""
    choice = (backend or os.environ.get(BACKEND_ENV) or "auto").lower()
    if choice not in ("auto", "triton", "torch"):
        raise ValueError(f"kernel backend must be auto, triton or torch, got {choice!r}")
    if choice == "auto":
        cuda = torch.device(device).type == "cuda"
        return "triton" if cuda and importlib.util.find_spec("triton") is not None else "torch"
    if choice == "triton" and torch.device(device).type != "cuda" and os.environ.get(
        "TRITON_INTERPRET", "0"
    ) in ("", "0"):
        raise RuntimeError("the Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 set before triton "
                           "is imported to run them in the interpreter")
    return choice  # type: ignore[return-value]


_TRITON_MODULES = {"verify_batch": "verify_triton", "tree_mask": "mask_triton",
                   "compact_kv": "compact_triton", "compact_pool": "compact_triton",
                   "tree_attention": "tree_attention_triton"}


def _impl(name: str, device: torch.device | str, backend: str | None) -> Any:
    if resolve_backend(device, backend) == "torch":
        return getattr(reference, name)
    module = importlib.import_module(f"{__package__}.{_TRITON_MODULES[name]}")  # imports triton
    return getattr(module, name)


def verify_batch(
    logits: torch.Tensor,  # [num_rows, vocab] bf16/fp16/fp32, each request's root row first
    tokens: torch.Tensor,  # [num_nodes]
    parents: torch.Tensor,  # [num_nodes] local, -1 = root
    row_offsets: torch.Tensor,  # [B + 1]
    temperature: torch.Tensor | None = None,  # [B]
    top_k: torch.Tensor | None = None,  # [B]
    top_p: torch.Tensor | None = None,  # [B]
    seed: torch.Tensor | None = None,  # [B]
    root_position: torch.Tensor | None = None,  # [B]
    *,
    mode: VerifyMode | str,
    max_nodes: int,
    draft_probs: torch.Tensor | None = None,  # [num_nodes, vocab] (rejection)
    backend: str | None = None,
    checked: bool = False,
) -> BatchVerifyOutput:
    """Verify a batch of draft trees: see ``reference.verify_batch`` (layout in kernels/verify_inputs.py).

    Parents and row offsets on the host are checked first (:func:`~.batch.check_batch_parents`,
    ValueError); ``checked=True`` says the caller already checked them before packing (the engine's
    :func:`~.batch.stage_requests` does). Device tensors are not read back to be checked: the
    kernels bound every walk by the tree size, so a malformed array gives wrong tokens, never a hang."""
    if not checked:
        check_batch_parents(parents, row_offsets, max_nodes)
    fn = _impl("verify_batch", logits.device, backend)
    return fn(logits, tokens, parents, row_offsets, temperature, top_k, top_p, seed, root_position,
              mode=mode, max_nodes=max_nodes, draft_probs=draft_probs)


def tree_mask(
    parents: torch.Tensor,  # [n] -1 = child of the prefix
    prefix_len: int,
    dtype: torch.dtype,
    *,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive mask [1, 1, n, prefix_len + n] and position ids [1, n]: see ``reference.tree_mask``.
    Host parents are checked first (:func:`~.batch.check_tree_parents`, ValueError)."""
    if parents.device.type == "cpu":
        check_tree_parents(parents.numpy(), parents.numel())
    return _impl("tree_mask", parents.device, backend)(parents, prefix_len, dtype)


def compact_kv(
    kv: torch.Tensor,  # [batch, kv_heads, seq, head_dim], edited in place
    accepted: torch.Tensor,  # [batch, max_nodes]
    num_accepted: torch.Tensor,  # [batch]
    base: torch.Tensor | int,  # [batch] or int: cache position of draft node 0
    *,
    backend: str | None = None,
) -> None:
    """Keep the accepted path's KV entries at ``base ...``: see ``reference.compact_kv``."""
    _impl("compact_kv", kv.device, backend)(kv, accepted, num_accepted, base)


def compact_pool(
    tensors: Sequence[torch.Tensor],  # a slot pool's [rows, slots, kv_heads, capacity, dim] tensors
    tensor_groups: Sequence[int],  # group of each tensor
    table: torch.Tensor,  # [R, COLS] int64 (compact_plan.pool_table)
    slots: torch.Tensor,  # [B] int64
    base: torch.Tensor,  # [B, G] int64
    accepted: torch.Tensor,  # [B, M]
    num_accepted: torch.Tensor,  # [B]
    *,
    backend: str | None = None,
) -> None:
    """Compact every layer's keys and values of a slot pool after a tree step, one launch on the
    GPU: see ``reference.compact_pool`` and :mod:`.compact_plan`."""
    _impl("compact_pool", accepted.device, backend)(tensors, tensor_groups, table, slots, base, accepted,
                                                    num_accepted)


def compact_cache(
    cache: Any,  # a transformers Cache whose .layers have .keys / .values [batch, heads, seq, dim]
    accepted: torch.Tensor,  # [batch, max_nodes]
    num_accepted: torch.Tensor,  # [batch]
    base: torch.Tensor | int,
    *,
    backend: str | None = None,
) -> None:
    """:func:`compact_kv` on the keys and values of every layer (the caller crops afterwards)."""
    for layer in cache.layers:
        for kv in (layer.keys, layer.values):
            if kv is not None and kv.numel() > 0:
                compact_kv(kv, accepted, num_accepted, base, backend=backend)


def tree_attention(
    query: torch.Tensor,  # [R, H, D] a bucket's queries (rotary applied)
    key: torch.Tensor,  # [R, KV, D] its rows' own keys
    value: torch.Tensor,  # [R, KV, DV]
    key_cache: torch.Tensor,  # [slots, KV, capacity, D] one layer's pool keys
    value_cache: torch.Tensor,  # [slots, KV, capacity, DV]
    row_slot: torch.Tensor,  # [R] int64
    row_first: torch.Tensor,  # [R] int64
    row_bits: torch.Tensor,  # [R, W] int64
    positions: torch.Tensor,  # [R] int64
    cache_len: torch.Tensor,  # [R] int64
    cache_start: torch.Tensor,  # [R] int64
    *,
    scale: float,
    window: int | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """The static step's attention, each row over its slot's cache and its own tree, fixed shapes and
    no host sync (a CUDA graph captures it): see ``reference.tree_attention``. -> [R, H, DV]"""
    fn = _impl("tree_attention", query.device, backend)
    return fn(query, key, value, key_cache, value_cache, row_slot, row_first, row_bits, positions, cache_len,
              cache_start, scale=scale, window=window)
