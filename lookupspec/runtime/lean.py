"""A lean forward for Llama-shaped models on CPU: the same arithmetic as transformers', less Python.

A one-token forward of SmolLM2-135M on a 2-core CPU spends ~20% of its time outside any tensor op:
transformers' module calls, keyword plumbing, output records and mask bookkeeping, 30 layers deep.
Decode and draft verification run that forward every step, so the overhead is paid once per step on
top of weights that are read from memory anyway.

:class:`LeanForward` runs the decoder directly on the layers' tensors with the *same torch ops in the
same order* as transformers' ``LlamaModel``/``Qwen2Model``/``MistralModel`` (RMSNorm as
``x * rsqrt(mean(x^2) + eps)`` then the weight, rotary embeddings with ``rotate_half``, the SiLU-gated
MLP) and the runtime's own attention (:func:`~lookupspec.runtime.attention.attend`, which the
runner's transformers path uses too), over a :class:`~lookupspec.runtime.ragged.RaggedBatch`. Its logits
and KV entries are bit-identical to the runner's transformers path (tested on the tiny families and on
SmolLM2). The runner uses it for every forward: decode, verification and prefill chunks, alone or
sharing one forward.

Where ``layer_ops.c`` builds (:mod:`lookupspec.runtime.native.layer_ops`), the rotary embedding with the rows'
KV-pool writes, and each residual sum with the RMSNorm after it, are one native call each (with the
native attention: the rotated queries go straight to ``attention.c``), with the same roundings as those
torch ops and the mean of squares summed in torch's order, so the same bits; elsewhere, or with
``LOOKUPSPEC_LEAN_NATIVE=torch``, the torch ops run.

When the model's linear layers are oneDNN-packed (:mod:`lookupspec.runtime.cpu_linear`), q/k/v and
gate/up each run as one :class:`~lookupspec.runtime.cpu_linear.FusedLinears` matmul (bit-identical to
the separate layers, checked when built): a decode step then makes 4 oneDNN calls per layer instead
of 7. The fused weights are a second copy of those projections (~280 MB for SmolLM2-135M in float32).
At prefill-chunk sizes the fused and the separate matmuls take the same time (128-row chunks of an
1,100-token prompt: 2.01 s through transformers' forward, 2.10 s lean, within this machine's noise).

:meth:`LeanForward.for_model` returns ``None`` for anything it does not cover (another architecture,
biases in the MLP, a non-SiLU activation, not CPU float32), and the runner keeps transformers'
forward for those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import rotate_half  # qwen2's and mistral's are the same

from .attention import attend, layer_pool
from .native import attention as native_attention
from .native import layer_ops

if TYPE_CHECKING:
    from .ragged import RaggedBatch

__all__ = ["LeanForward"]

_SUPPORTED = ("llama", "qwen2", "mistral")


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
    from .cpu_linear import FusedLinears, PackedLinear, QuantizedLinear

    if all(type(lin) is PackedLinear for lin in linears):
        fused = FusedLinears.fuse(linears)
        if fused is not None:
            return fused
    if all(type(lin) is QuantizedLinear for lin in linears):
        stacked = QuantizedLinear.stack(linears)
        if stacked is not None:
            return stacked
    return lambda x: torch.cat([lin(x) for lin in linears], dim=-1)


class LeanForward:
    """``__call__(batch, keep)`` -> logits ``[rows, vocab]``, or of the rows ``keep`` lists.
    ``windows[i]`` is layer ``i``'s sliding window (None: full attention), as the KV pool lays it out."""

    def __init__(self, model: Any, windows: list[int | None]) -> None:
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
        self.windows = list(windows)
        self._query = torch.empty(1, self.n_heads, 0, self.head_dim)  # a query's shape, for applies()
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
    def for_model(cls, model: Any, windows: list[int | None]) -> LeanForward | None:
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
        if getattr(cfg, "hidden_act", None) != "silu" or getattr(cfg, "mlp_bias", False):
            return None
        if not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
            return None
        if len(windows) != len(inner.layers):
            return None
        return cls(model, windows)

    def _native_attention(self, batch: RaggedBatch) -> Any:
        """The attention kernel when this forward's layers can take the native path end to end (the
        rotary embedding and the pool writes in ``layer_ops.c``, attention in ``attention.c``: every
        pool group as :func:`~lookupspec.runtime.native.attention.applies` wants it, with the model's
        key/value heads and values as wide as the heads), else None."""
        lib = native_attention.kernel()
        if lib is None:
            return None
        for group in batch.pool.groups:
            keys, values = batch.pool.keys(group.layers[0]), batch.pool.values(group.layers[0])
            if (values.shape[-1] != self.head_dim or keys.shape[1] != self.n_kv
                    or values.device != keys.device
                    or not native_attention.applies(self._query, keys, values)):
                return None
        return lib

    def _add_norm(self, native: Any) -> Any:
        """``(h, y, weight, eps) -> (h + y, RMSNorm(h + y))`` (``y`` None: no sum): one native pass
        that updates ``h`` in place where ``layer_ops.c`` can sum the squares in torch's order
        (:func:`~lookupspec.runtime.native.layer_ops.sum_lanes`), else the torch sum and mean of squares
        with the native scaling, or the torch ops."""
        lanes = None if native is None else layer_ops.sum_lanes(native, int(self.embed.shape[1]))

        def add_norm(h: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
            if lanes is not None and h.is_contiguous():
                return h, layer_ops.add_rms_norm(native, h, y, weight, eps, lanes)
            if y is not None:
                h = h + y
            if native is not None:
                return h, layer_ops.rms_norm(native, h, weight, eps)
            return h, _rms_norm(h, weight, eps)

        return add_norm

    @torch.inference_mode()
    def __call__(self, batch: RaggedBatch, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[rows, vocab]`` (only of the rows listed in ``keep``, a 1-D index tensor, when
        given: a prefill chunk needs its last row's) for a ragged batch whose sequences' earlier
        positions are in ``batch.pool``; writes the rows' keys and values there."""
        n = batch.rows
        h = F.embedding(batch.input_ids, self.embed)
        cos, sin = self.rotary(h, position_ids=batch.position_ids)
        d, nq, nkv = self.head_dim, self.n_heads, self.n_kv
        inter = self.intermediate
        native = layer_ops.kernel()  # the element-wise steps in one call each (same bits)
        attn = self._native_attention(batch) if native is not None else None
        add_norm = self._add_norm(native)
        if attn is None:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        else:
            cos, sin = cos[0], sin[0]
        h, x = add_norm(h, None, self.layers[0].norm_in, self.layers[0].norm_in_eps)
        for i, layer in enumerate(self.layers):
            if attn is not None and native is not None:
                gi, keys, values = layer_pool(batch, i, self.windows[i])
                q = layer_ops.rope_store(native, layer.qkv(x).view(n, nq + 2 * nkv, d), cos, sin, nq, nkv,
                                           keys, values, batch.write_slot, batch.write_entry[gi],
                                           batch.real_rows)
                att = native_attention.attend_native(attn, batch, gi, q, keys, values, self.scaling)
            else:
                qkv = layer.qkv(x).view(1, n, nq + 2 * nkv, d).transpose(1, 2)
                qk = qkv[:, : nq + nkv]
                qk = (qk * cos) + (rotate_half(qk) * sin)
                att = attend(batch, i, qk[:, :nq], qk[:, nq:], qkv[:, nq + nkv:], scaling=self.scaling,
                             window=self.windows[i])
            h, x = add_norm(h, layer.o_proj(att.reshape(1, n, nq * d)), layer.norm_post, layer.norm_post_eps)
            gu = layer.gate_up(x)
            after = self.layers[i + 1] if i + 1 < len(self.layers) else None  # the next norm: its or the last
            weight, eps = (after.norm_in, after.norm_in_eps) if after else (self.norm, self.norm_eps)
            h, x = add_norm(h, layer.down(F.silu(gu[..., :inter]) * gu[..., inter:]), weight, eps)
        h = x
        if keep is not None:
            h = h[:, keep]
        return self.lm_head(h)[0]
