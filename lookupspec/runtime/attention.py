"""Attention for the runtime: ragged attention over the slot pool, registered with transformers.

:func:`attend` is the one place attention happens in a runtime forward, for the lean forward and for
transformers' own forward alike. It writes the batch's new keys and values into the
:class:`~lookupspec.runtime.kvpool.SlotPool` (one indexed copy per tensor and layer), then attends:
on the CPU in float32 through :mod:`~lookupspec.runtime.native.attention` (one native call for the
whole batch), elsewhere with ``scaled_dot_product_attention`` once per sequence, over exactly
that sequence's keys with its own mask (:mod:`lookupspec.runtime.ragged`). Either way a sequence's
attention is the same computation whatever else is in the batch, which is what makes a batched
forward bit-identical to the batch-of-one forward wherever the row-wise ops are (see
``ModelRunner``'s probe).

transformers' forward reaches it through the attention interface: :func:`use_runtime_attention`
registers :data:`ATTN_NAME` and switches a model to it. While a batch is active
(:func:`active_batch`, set by the runner around its forward) the function runs :func:`attend`;
otherwise it behaves like transformers' ``sdpa`` (grouped-query heads read in place for multi-token
CPU forwards rather than copied: bit-identical, and a draft-tree forward skips a copy of the cache),
so the same model object still works with ``generate`` and with a draft model's own cache.
Layers with attention sinks (gpt-oss), and layers with logit soft-capping (Gemma 2) where the
native CPU kernel does not run, take an explicit softmax path per sequence instead of SDPA.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from .native import attention as native_attention

if TYPE_CHECKING:
    from .ragged import RaggedBatch

__all__ = ["ATTN_NAME", "active_batch", "attend", "gqa_sdpa_attention", "layer_pool", "unplanned_sdpa",
           "use_runtime_attention"]

ATTN_NAME = "lookupspec_runtime"

_BATCH: contextvars.ContextVar[RaggedBatch | None] = contextvars.ContextVar("lookupspec_batch", default=None)


@contextlib.contextmanager
def active_batch(batch: RaggedBatch) -> Iterator[None]:
    """Route every attention call of the models switched to :data:`ATTN_NAME` through ``batch``."""
    token = _BATCH.set(batch)
    try:
        yield
    finally:
        _BATCH.reset(token)


def unplanned_sdpa(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """On CUDA: ``scaled_dot_product_attention`` without cuDNN's backend, which builds (and caches) a
    graph for every new shape (tens of milliseconds for the first call at each new key length of a
    decode row, against a fraction of a millisecond with flash attention), while a decode row's key
    length is new at nearly every step. Flash attention plans nothing per shape. Elsewhere: torch's
    own choice. Runtime forwards use it for unmasked views, and for masked ones where the runner's
    probe allows (:func:`attend`); a draft model's forwards, whose numbers only need to be
    deterministic, use it throughout."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | str | None,
          scaling: float | None) -> torch.Tensor:
    """q [1, H, n, d], k/v [1, KV, L, d] -> [1, H, n, dv]."""
    from .ragged import CAUSAL

    gqa = q.shape[1] != k.shape[1]
    if gqa and isinstance(mask, torch.Tensor) and q.is_cuda:
        # transformers repeats the key/value heads where a mask is given on CUDA (its use_gqa_in_sdpa),
        # which leaves the memory-efficient kernel eligible: it takes masks but not enable_gqa, so
        # enable_gqa here would run the math kernel, and the load probe would find the two disagreeing
        g = q.shape[1] // k.shape[1]
        k, v, gqa = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1), False
    if isinstance(mask, str):  # CAUSAL
        causal = mask == CAUSAL
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scaling, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=gqa)


def _explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | str | None,
              scaling: float, softcap: float | None, sinks: torch.Tensor | None) -> torch.Tensor:
    """Attention written out (soft-capped logits, sinks).

    q [1, H, n, d], k/v [1, KV, L, d] -> [1, H, n, dv]."""
    from .ragged import CAUSAL

    heads, kv_heads, n, d = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
    g = heads // kv_heads
    qg = q.reshape(1, kv_heads, g * n, d)
    scores = torch.matmul(qg, k.transpose(-1, -2)).view(1, heads, n, -1) * scaling  # [1, H, n, L]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if isinstance(mask, str) and mask == CAUSAL:
        length = scores.shape[-1]
        mask = torch.ones(n, length, dtype=torch.bool, device=q.device).tril(length - n)[None, None]
    if mask is not None:
        assert isinstance(mask, torch.Tensor)
        scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink = sinks.reshape(1, heads, 1, 1).expand(1, heads, n, 1).to(scores.dtype)
        scores = torch.cat([scores, sink], dim=-1)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    if sinks is not None:
        probs = probs[..., :-1]
    out = torch.matmul(probs.reshape(1, kv_heads, g * n, -1), v)  # [1, KV, g * n, dv]
    return out.view(1, heads, n, v.shape[-1])


def layer_pool(batch: RaggedBatch, layer: int, window: int | None) -> tuple[int, torch.Tensor, torch.Tensor]:
    """``layer``'s pool group and its keys and values ``[slots, kv_heads, capacity, dim]``; raises
    when the layer's window is not the one the pool was laid out for."""
    pool = batch.pool
    gi = pool.group_index(layer)
    group = pool.groups[gi]
    if window != group.window:
        raise RuntimeError(f"layer {layer} attends with window {window}, but the KV pool was laid out for "
                           f"{group.window}: the model's layer types and the pool disagree")
    return gi, pool.keys(layer), pool.values(layer)


def attend(batch: RaggedBatch, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
           scaling: float | None, window: int | None, softcap: float | None = None,
           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One layer's attention for a ragged batch.

    query: [1, heads, rows, head_dim]; key/value: [1, kv_heads, rows, dim] (the rows' own keys and
    values, rotary embeddings applied). Returns [1, rows, heads, value_dim] (pad rows zero)."""
    gi, keys, values = layer_pool(batch, layer, window)
    real = batch.real_rows
    # every row's key and value into its sequence's slot: one indexed copy per tensor
    keys[batch.write_slot, :, batch.write_entry[gi]] = key[0, :, :real].transpose(0, 1).to(keys.dtype)
    values[batch.write_slot, :, batch.write_entry[gi]] = value[0, :, :real].transpose(0, 1).to(values.dtype)
    explicit = softcap is not None or sinks is not None
    if sinks is None and native_attention.applies(query, keys, values):
        lib = native_attention.kernel()
        if lib is not None:  # every view in one native call (soft-capped scores too)
            return native_attention.attend_native(lib, batch, gi, query, keys, values, scaling, softcap)
    heads, kv_heads, d = query.shape[1], keys.shape[1], query.shape[-1]
    width = heads * values.shape[-1]
    rows = query[0].transpose(0, 1)  # [rows, heads, head_dim], a view
    parts: list[Any] = [None] * len(batch.views)  # each sequence's output rows, [n, heads * value_dim]

    def one(i: int) -> None:
        view = batch.views[i]
        lo, hi = view.key_range[gi]
        k = keys[view.slot:view.slot + 1, :, lo:hi]
        v = values[view.slot:view.slot + 1, :, lo:hi]
        mask = view.masks[gi]
        if view.rows == 1 and mask is None and heads != kv_heads and not explicit:
            # a decode row (most of a step's views): its query heads as rows of their key/value head,
            # which SDPA then reads once for the whole group, without the general path's copies
            grouped = rows[view.r0].reshape(1, kv_heads, heads // kv_heads, d)
            parts[i] = F.scaled_dot_product_attention(grouped, k, v, scale=scaling).reshape(1, width)
            return
        q = query[:, :, view.r0:view.r1]
        if explicit:
            scale = scaling if scaling is not None else d ** -0.5
            o = _explicit(q, k, v, mask, scale, softcap, sinks)
        else:
            o = _sdpa(q, k, v, view.sdpa_mask(gi, q.dtype), scaling)
        parts[i] = o[0].transpose(0, 1).reshape(view.rows, width)

    # unmasked views (decode rows) where no backend plans per shape; masked ones (draft trees, prompt
    # chunks after a cache) too where the runner's probe found the runtime agreeing with transformers
    # that way (batch.unplanned_masks), else on torch's choice
    unplanned = [i for i, view in enumerate(batch.views)
                 if (view.masks[gi] is None or batch.unplanned_masks) and not explicit]
    with unplanned_sdpa(query.device):
        for i in unplanned:
            one(i)
    for i in range(len(batch.views)):
        if parts[i] is None:
            one(i)
    if batch.pad:
        parts.append(query.new_zeros((batch.pad, width)))
    return torch.cat(parts).view(1, batch.rows, heads, -1)


def gqa_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                       value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                       scaling: float | None = None, is_causal: bool | None = None,
                       **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' ``sdpa`` attention, except that a multi-token CPU forward with grouped heads
    reads the key/value heads in place (``enable_gqa``) instead of repeating them: the same flash
    kernel, bit-identical output. query [b, heads, q, d], key/value [b, kv_heads, k, d] ->
    ([b, q, heads, d], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len, kv_len = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    if (getattr(module, "num_key_value_groups", 1) > 1 and q_len > 1 and query.device.type == "cpu"
            and not any(kwargs.get(k) is not None for k in ("softcap", "position_bias", "cache", "s_aux"))
            and not kwargs.get("output_attentions", False)
            and (attention_mask is not None or not causal or kv_len == q_len)):
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
            is_causal=bool(attention_mask is None and causal), enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if kwargs.get("s_aux") is not None or kwargs.get("softcap") is not None:
        # attention sinks (gpt-oss) or soft-capped logits (Gemma 2): transformers' own explicit
        # softmax, which wants an additive mask where the sdpa masks may be boolean or skipped
        from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as capped
        from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as with_sinks

        explicit: Any = with_sinks if kwargs.get("s_aux") is not None else capped
        mask = _additive(attention_mask, query, key, causal)
        out, _ = explicit(module, query, key, value, mask, dropout=dropout, scaling=scale, **kwargs)
        return out, None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                  scaling=scaling, is_causal=is_causal, **kwargs)


def _additive(mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor,
              causal: bool) -> torch.Tensor | None:
    """An sdpa-style mask (boolean, or None where sdpa would use ``is_causal``) as the additive float
    mask transformers' explicit attention adds to the scores: [b, 1, q, k]."""
    q_len, kv_len = query.shape[2], key.shape[2]
    if mask is None:
        if not causal or q_len == 1:
            return None
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril(kv_len - q_len)
        mask = mask[None, None]
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~mask, torch.finfo(query.dtype).min)
    return mask


def runtime_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The function registered as :data:`ATTN_NAME`: :func:`attend` while a batch is active,
    :func:`gqa_sdpa_attention` otherwise."""
    batch = _BATCH.get()
    if batch is None:
        return gqa_sdpa_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)
    layer = getattr(module, "layer_idx", None)
    if layer is None:
        raise RuntimeError(f"{type(module).__name__} has no layer_idx: the runtime cannot place its keys")
    unsupported = [k for k in ("position_bias", "cache", "head_mask") if kwargs.get(k) is not None]
    if unsupported:
        raise NotImplementedError(f"{type(module).__name__} passes {unsupported} to attention, which "
                                  "lookupspec's runtime does not support")
    out = attend(batch, int(layer), query, key, value, scaling=scaling, window=kwargs.get("sliding_window"),
                 softcap=kwargs.get("softcap"), sinks=kwargs.get("s_aux"))
    return out, None


def _runtime_mask(*args: Any, **kwargs: Any) -> Any:
    """Mask creation for :data:`ATTN_NAME`: nothing while a batch is active (the batch carries its
    own masks), transformers' ``sdpa`` masks otherwise."""
    if _BATCH.get() is not None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, runtime_attention)
    AttentionMaskInterface.register(ATTN_NAME, _runtime_mask)
    _registered = True


def use_runtime_attention(model: Any) -> bool:
    """Switch ``model`` (in place) to :data:`ATTN_NAME`; True if it now uses it. Models on ``eager``
    attention switch too (the runtime's attention is exact attention; only the implementation
    differs)."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    if getattr(config, "_attn_implementation", None) == ATTN_NAME:
        return True
    _register()
    model.set_attn_implementation(ATTN_NAME)
    return getattr(model.config, "_attn_implementation", None) == ATTN_NAME
