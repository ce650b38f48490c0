"""A lean decode/verify forward for Llama-shaped models on CPU: the same arithmetic, less Python.

A one-token forward of SmolLM2-135M on this 2-core CPU spends ~20% of its time outside any tensor
op: transformers' module calls, keyword plumbing, output records, mask and cache bookkeeping, 30
layers deep. Speculative decoding runs that forward (over 1 to ~30 tokens) every step, so the
overhead is paid once per step on top of weights that are read from memory anyway.

:class:`LeanForward` runs the decoder directly on the layers' tensors with the *same torch ops in the
same order* as transformers' ``LlamaModel``/``Qwen2Model`` (RMSNorm as ``x * rsqrt(mean(x^2) + eps)``
then the weight, rotary embeddings with ``rotate_half``, SDPA with grouped heads read in place, the
SiLU-gated MLP), writing keys and values straight into :class:`~lookupspec.kvcache.KVCache`'s
buffers. The output is bit-identical to the model's own forward (tested on both tiny families and on
SmolLM2), so exactness is unaffected; only forwards with a cache already filled (decode and draft
verification) take this path, prefill stays on transformers.

When the model's linear layers are oneDNN-packed (:mod:`lookupspec.cpu_linear`), q/k/v and gate/up
each run as one :class:`~lookupspec.cpu_linear.FusedLinears` matmul (bit-identical to the separate
layers, checked when built): a decode step then makes 4 oneDNN calls per layer instead of 7. The
fused weights are a second copy of those projections (~280 MB for SmolLM2-135M in float32); the
model keeps its own layers for prefill, where the separate matmuls are faster.

:meth:`LeanForward.for_model` returns ``None`` for anything it does not cover (another architecture,
biases in the MLP, sliding windows, a non-SiLU activation, not CPU, an attention implementation
other than ``sdpa``), and the engine keeps transformers' forward for those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import rotate_half  # qwen2's is the same function

__all__ = ["LeanForward"]

_SUPPORTED = ("llama", "qwen2")


@dataclass
class _Layer:
    norm_in: torch.Tensor
    norm_in_eps: float
    qkv: Any  # a callable x -> [.., q | k | v]
    o_proj: Any
    norm_post: torch.Tensor
    norm_post_eps: float
    gate_up: Any  # x -> [.., gate | up]
    down: Any


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm for float32 input, op for op."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def _joint(linears: list[Any]) -> Any:
    """A callable ``x -> cat([lin(x) for lin in linears], -1)``: one fused oneDNN matmul when the
    layers are packed and fuse bit-identically, else one call per layer."""
    from lookupspec.cpu_linear import FusedLinears, PackedLinear

    if all(type(lin) is PackedLinear for lin in linears):
        fused = FusedLinears.fuse(linears)
        if fused is not None:
            return fused
    return lambda x: torch.cat([lin(x) for lin in linears], dim=-1)


class LeanForward:
    """``__call__(input_ids [1, n], cache, attention_mask, position_ids, logits_to_keep)`` -> logits
    ``[n or logits_to_keep, vocab]`` for a model whose ``cache`` already holds the context."""

    def __init__(self, model: Any) -> None:
        inner = model.model
        cfg = model.config
        self.embed = inner.embed_tokens.weight
        self.rotary = inner.rotary_emb
        self.norm = inner.norm.weight
        self.norm_eps = float(inner.norm.variance_epsilon)
        self.lm_head = model.lm_head
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(cfg.num_key_value_heads)
        self.scaling = float(inner.layers[0].self_attn.scaling)
        self.intermediate = int(cfg.intermediate_size)
        self.layers: list[_Layer] = []
        for layer in inner.layers:
            att, mlp = layer.self_attn, layer.mlp
            self.layers.append(_Layer(
                norm_in=layer.input_layernorm.weight,
                norm_in_eps=float(layer.input_layernorm.variance_epsilon),
                qkv=_joint([att.q_proj, att.k_proj, att.v_proj]),
                o_proj=att.o_proj,
                norm_post=layer.post_attention_layernorm.weight,
                norm_post_eps=float(layer.post_attention_layernorm.variance_epsilon),
                gate_up=_joint([mlp.gate_proj, mlp.up_proj]),
                down=mlp.down_proj,
            ))

    @classmethod
    def for_model(cls, model: Any) -> LeanForward | None:
        """A :class:`LeanForward` for ``model``, or ``None`` when the model is outside what it covers
        (and the caller should use the model's own forward)."""
        cfg = getattr(model, "config", None)
        inner = getattr(model, "model", None)
        if cfg is None or inner is None or getattr(cfg, "model_type", None) not in _SUPPORTED:
            return None
        try:
            param = next(model.parameters())
        except StopIteration:
            return None
        if param.device.type != "cpu" or param.dtype != torch.float32:
            return None
        from lookupspec.cpu_attention import ATTN_NAME

        if getattr(cfg, "_attn_implementation", None) not in ("sdpa", ATTN_NAME):
            return None
        if getattr(cfg, "hidden_act", None) != "silu" or getattr(cfg, "mlp_bias", False):
            return None
        if getattr(cfg, "use_sliding_window", False) and getattr(cfg, "sliding_window", None):
            return None
        if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
            return None
        if not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
            return None
        return cls(model)

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, cache: Any, attention_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None, logits_to_keep: int = 0) -> torch.Tensor:
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            shape = tuple(input_ids.shape)
            raise ValueError(f"LeanForward runs one sequence: input_ids must be [1, n], got {shape}")
        n = int(input_ids.shape[1])
        past = cache.length
        if past == 0:
            raise ValueError("LeanForward needs a filled cache (prefill goes through the model)")
        if position_ids is None:
            position_ids = torch.arange(past, past + n, device=input_ids.device)[None, :]
        if attention_mask is None and n > 1:  # a chain: token i sees the cache and tokens 0..i
            kv = torch.arange(past + n, device=input_ids.device)
            attention_mask = (kv[None, :] <= (past + torch.arange(n, device=input_ids.device))[:, None])
            attention_mask = attention_mask[None, None]
        h = F.embedding(input_ids, self.embed)
        cos, sin = self.rotary(h, position_ids=position_ids)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        d, nq, nkv = self.head_dim, self.n_heads, self.n_kv
        inter = self.intermediate
        for i, layer in enumerate(self.layers):
            x = _rms_norm(h, layer.norm_in, layer.norm_in_eps)
            qkv = layer.qkv(x).view(1, n, nq + 2 * nkv, d).transpose(1, 2)
            qk = qkv[:, : nq + nkv]
            qk = (qk * cos) + (rotate_half(qk) * sin)
            keys, values = cache.buffered[i].update(qk[:, nq:], qkv[:, nq + nkv:])
            if n == 1 and attention_mask is not None and nq != nkv:  # transformers' pack_gqa case
                att = F.scaled_dot_product_attention(
                    qk[:, :nq].reshape(1, nkv, nq // nkv, d), keys, values, attn_mask=attention_mask,
                    scale=self.scaling).reshape(1, nq, 1, d)
            else:
                att = F.scaled_dot_product_attention(
                    qk[:, :nq], keys, values, attn_mask=attention_mask, scale=self.scaling, enable_gqa=True)
            att = att.transpose(1, 2).reshape(1, n, nq * d)
            h = h + layer.o_proj(att)
            x = _rms_norm(h, layer.norm_post, layer.norm_post_eps)
            gu = layer.gate_up(x)
            h = h + layer.down(F.silu(gu[..., :inter]) * gu[..., inter:])
        h = _rms_norm(h, self.norm, self.norm_eps)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        return self.lm_head(h)[0]
