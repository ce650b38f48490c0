"""The static-shape forward of a Llama-family model over one bucket (:mod:`.layout`).

The same modules and the same order of operations as transformers' ``LlamaModel`` (embedding,
per layer the input RMSNorm, q/k/v projections, rotary embedding with ``rotate_half``, attention,
``o_proj``, the residual sums, the post-attention RMSNorm and the MLP; then the final norm and the
LM head), with the runtime's own two pieces in the attention:

- the rows' keys and values go into the KV pool with one indexed copy per tensor and layer, at the
  bucket's precomputed ``(write_slot, write_entry)``: padding rows to the scratch slot;
- attention is :func:`lookupspec.kernels.tree_attention` (Triton on CUDA, its torch twin elsewhere):
  each row over its slot's cache and its own tree, sliding windows included.

Every tensor has a shape fixed by the bucket and the model; nothing reads a value back to the host
(no ``.item()``, no boolean indexing, no shape from data). So the forward is what a CUDA graph
captures (:mod:`.graphs`); eagerly it runs anywhere, which is how the CPU tests check it against
today's path.

:func:`unsupported` says why a model cannot run here (another architecture, q/k norms, a RoPE type
whose frequencies depend on the positions seen, values narrower than keys, ...); the caller keeps
the eager ragged path for it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.models.llama.modeling_llama import rotate_half  # qwen2's and mistral's are the same

from lookupspec import kernels

from ..kvpool import SlotPool
from .layout import StepTensors

__all__ = ["SUPPORTED", "StaticForward", "unsupported"]

SUPPORTED = ("llama", "qwen2", "mistral")
_SYNCING_ROPE = ("dynamic", "longrope")  # their frequency update reads the largest position on the host


def unsupported(model: Any, windows: list[int | None]) -> str | None:
    """Why the static forward cannot run ``model`` (None: it can). ``windows``: each layer's sliding
    window as the KV pool lays it out."""
    cfg = getattr(model, "config", None)
    kind = getattr(cfg, "model_type", type(model).__name__)
    if cfg is None or kind not in SUPPORTED:
        return f"the static step covers {', '.join(SUPPORTED)} models, not {kind}"
    inner = getattr(model, "model", None)
    needed = ("embed_tokens", "rotary_emb", "layers", "norm")
    if inner is None or not all(hasattr(inner, a) for a in needed) or not hasattr(model, "lm_head"):
        return f"{type(model).__name__} does not have the Llama module layout"
    rope = getattr(getattr(inner, "rotary_emb", None), "rope_type", "default")
    if any(kind_ in str(rope) for kind_ in _SYNCING_ROPE):
        return f"the {rope} rotary embedding reads positions back to the host"
    if len(windows) != len(inner.layers):
        return f"the KV pool lays out {len(windows)} layers for {len(inner.layers)}"
    att = inner.layers[0].self_attn
    if any(hasattr(att, name) for name in ("q_norm", "k_norm", "sinks")):
        return f"{type(att).__name__} normalises its queries or keys, or has attention sinks"
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if not hasattr(att, name):
            return f"{type(att).__name__} has no {name}"
    return None


class StaticForward:
    """``__call__(inputs, pool)`` -> logits ``[R, vocab]`` for a bucket's inputs, writing every row's
    keys and values into ``pool`` (padding rows into the scratch slot)."""

    def __init__(self, model: Any, windows: list[int | None], *, backend: str | None = None) -> None:
        reason = unsupported(model, windows)
        if reason is not None:
            raise ValueError(reason)
        inner = model.model
        cfg = model.config
        self.model = model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.norm = inner.norm
        self.lm_head = model.lm_head
        self.layers = list(inner.layers)
        self.windows = list(windows)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads)
        self.scales = [float(layer.self_attn.scaling) for layer in self.layers]
        self.backend = backend  # the attention kernel's (None: the dispatcher's choice)

    @torch.inference_mode()
    def __call__(self, inputs: StepTensors, pool: SlotPool) -> torch.Tensor:
        rows = inputs.input_ids.shape[0]
        ids = inputs.input_ids[None]  # [1, R]
        h = self.embed(ids)  # [1, R, hidden]
        cos, sin = self.rotary(h, position_ids=inputs.positions[None])  # [1, R, head_dim]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [1, 1, R, head_dim], as apply_rotary_pos_emb
        nq, nkv, d = self.n_heads, self.n_kv, self.head_dim
        for i, layer in enumerate(self.layers):
            att = layer.self_attn
            x = layer.input_layernorm(h)
            q = att.q_proj(x).view(1, rows, nq, d).transpose(1, 2)  # [1, H, R, d]
            k = att.k_proj(x).view(1, rows, nkv, d).transpose(1, 2)
            v = att.v_proj(x).view(1, rows, nkv, d).transpose(1, 2)
            q = (q * cos) + (rotate_half(q) * sin)
            k = (k * cos) + (rotate_half(k) * sin)
            g = pool.group_index(i)
            keys, values = pool.keys(i), pool.values(i)  # [slots, KV, capacity, d]
            k_rows, v_rows = k[0].transpose(0, 1), v[0].transpose(0, 1)  # [R, KV, d]
            entry = inputs.write_entry[g]
            keys[inputs.write_slot, :, entry] = k_rows.to(keys.dtype)
            values[inputs.write_slot, :, entry] = v_rows.to(values.dtype)
            o = kernels.tree_attention(q[0].transpose(0, 1), k_rows, v_rows, keys, values, inputs.row_slot,
                                       inputs.row_first, inputs.row_bits, inputs.positions,
                                       inputs.cache_len[g], inputs.cache_start[g], scale=self.scales[i],
                                       window=self.windows[i], backend=self.backend)  # [R, H, d]
            h = h + att.o_proj(o.reshape(1, rows, nq * d))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.lm_head(self.norm(h))[0]
