"""KV cache with preallocated buffers and in-place compaction, for Hugging Face models.

transformers' ``DynamicLayer`` concatenates every step (``torch.cat`` over the whole cache, per layer,
per forward). :class:`BufferedLayer` writes new entries into a preallocated ``[batch, kv_heads,
capacity, head_dim]`` buffer instead (capacity doubles when full) and exposes ``keys``/``values`` as
views of the filled prefix, so a decode step copies only the new entries.

Speculation needs ``truncate(length)``: drop everything from ``length`` on (rejected drafts), O(1).
After a tree step, ``lookupspec.kernels.compact_cache`` first moves the accepted path's entries next
to the root, writing through the ``keys``/``values`` views into the buffers.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

__all__ = ["BufferedLayer", "KVCache"]


class BufferedLayer(DynamicLayer):
    """One layer's keys and values in growable preallocated buffers."""

    def __init__(self, capacity: int = 512) -> None:
        super().__init__()
        self._capacity_hint = max(int(capacity), 16)
        self._len = 0
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, n, d = key_states.shape
        cap = max(self._capacity_hint, 2 * n)
        self._kbuf = key_states.new_empty((b, h, cap, d))
        self._vbuf = value_states.new_empty((b, h, cap, value_states.shape[-1]))
        self._len = 0
        self.is_initialized = True
        self._refresh()

    def _refresh(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self._kbuf is not None and self._vbuf is not None
        keys = self._kbuf[:, :, : self._len]
        values = self._vbuf[:, :, : self._len]
        self.keys, self.values = keys, values
        return keys, values

    def _ensure(self, needed: int) -> None:
        assert self._kbuf is not None and self._vbuf is not None
        cap = self._kbuf.shape[2]
        if needed <= cap:
            return
        new_cap = max(needed, 2 * cap)  # (called from update, inside the forward's inference mode)
        k = self._kbuf.new_empty((*self._kbuf.shape[:2], new_cap, self._kbuf.shape[3]))
        v = self._vbuf.new_empty((*self._vbuf.shape[:2], new_cap, self._vbuf.shape[3]))
        k[:, :, : self._len].copy_(self._kbuf[:, :, : self._len])
        v[:, :, : self._len].copy_(self._vbuf[:, :, : self._len])
        self._kbuf, self._vbuf = k, v

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states/value_states: [batch, kv_heads, n, head_dim] -> the whole cache (views)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[2]
        self._ensure(self._len + n)
        assert self._kbuf is not None and self._vbuf is not None
        self._kbuf[:, :, self._len : self._len + n].copy_(key_states)
        self._vbuf[:, :, self._len : self._len + n].copy_(value_states)
        self._len += n
        return self._refresh()

    def get_seq_length(self) -> int:
        return self._len

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' convention: a negative count of tokens to remove from the end."""
        if tokens_to_remove > 0:
            raise ValueError("crop expects a negative number of tokens to remove")
        self.truncate(self._len + tokens_to_remove)

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot truncate a cache of {self._len} entries to {length}")
        if self.is_initialized:
            self._len = length
            self._refresh()

    def reset(self) -> None:
        self._len = 0
        if self.is_initialized:
            self._refresh()


class KVCache(Cache):
    """A transformers ``Cache`` made of :class:`BufferedLayer` (full-attention models only)."""

    def __init__(self, num_layers: int, capacity: int = 512) -> None:
        self.buffered = [BufferedLayer(capacity) for _ in range(num_layers)]
        self.capacity = capacity
        super().__init__(layers=list(self.buffered))

    @classmethod
    def for_model(cls, model: Any, capacity: int = 512) -> KVCache:
        cfg = model.config.get_text_config(decoder=True)
        if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
            layer_types = getattr(cfg, "layer_types", None) or []
            if any(t != "full_attention" for t in layer_types):
                raise ValueError("sliding-window attention layers are not supported by lookupspec's KV cache")
        return cls(int(cfg.num_hidden_layers), capacity)

    @property
    def length(self) -> int:
        return self.buffered[0].get_seq_length() if self.buffered else 0

    def truncate(self, length: int) -> None:
        for layer in self.buffered:
            layer.truncate(length)
