"""Prefix cache: the KV of recent prompts' whole blocks, reused by prompts that start alike.

RAG traffic repeats itself: the same system prompt on every call, the same retrieved passages for
related questions. The keys and values a prompt's first ``k * C`` tokens produce depend only on those
tokens, whenever the prefill reproduces its bits: so after each block of ``C`` tokens a prefill
completes, the cache keeps a copy of that block's KV entries (every layer; sliding-window layers too,
which is why the copy is taken right after the forward that completes the block, before the window
drops it), and a later prompt that starts with the same blocks gets them copied into its slot and
prefills only the rest, from the next block boundary on. Its tokens are then exactly those of a
prefill from scratch (tested bit for bit).

The engine chooses ``C``: where prompts are prefilled in whole chunks at fixed offsets (0, chunk,
2 chunk, ...) only a whole chunk reproduces a prefill's bits, so a block is a chunk; where the forward
is chunk-invariant (:attr:`lookupspec.engine.Engine.free_chunks`) any chunking gives the same bits, and
blocks are smaller than a chunk (32 tokens by default), so that prompts sharing less than a chunk (a
system prompt, an instruction header) share blocks.

Index: a chain of blocks. A block's key is (its parent block, its ``C`` tokens), with the namespace as
the parent of a prompt's first block, in one dict. Finding a prompt's longest cached prefix walks the
prompt one block at a time, one dict lookup each: time proportional to the prompt, independent of how
many blocks are cached, and exact (the key holds the tokens themselves, so there are no hash
collisions to verify). This is vLLM's block-hash chain with the hash replaced by the block's tokens,
or equally a token trie whose edges are whole blocks.

Namespaces: a block is found only under the namespace that stored it (the chain starts at the
namespace), the same isolation as documents and outputs.

Memory: at most ``max_bytes``; least recently used leaf blocks (no cached child depends on them) are
evicted first. An evicted block's buffers (two blocks' at most, beyond ``max_bytes``) take the next
stored block: a fresh buffer's pages are faulted in on first write whatever the allocator had just
freed (~8 ms for SmolLM2's 6 MB 128-token block, a hundred times the copy into a used one), and a
cache that is full stores a block per eviction, inside the scheduler's loop, where every stream waits
for it.

A prompt reuses at most ``(len - 1) // C`` blocks: its last token is always prefilled, since its
logits choose the first token.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .kvpool import SlotPool

__all__ = ["PrefixBlock", "PrefixCache", "PrefixCacheStats"]


@dataclass(eq=False)
class PrefixBlock:
    """One cached block: its KV entries per pool group, as ``SlotPool`` group tensors without the slot
    dimension: ``[rows, kv_heads, C, dim]`` (rows: 2 x layers, or layers for keys and values apart)."""

    id: int
    parent: PrefixBlock | None
    key: tuple[object, tuple[int, ...]]
    data: list[list[torch.Tensor]]  # [group][tensor]
    nbytes: int
    last_used: int
    children: int = 0


@dataclass
class PrefixCacheStats:
    lookups: int = 0  # prompts looked up
    hits: int = 0  # prompts that reused at least one block
    hit_tokens: int = 0  # prompt tokens reused
    stored: int = 0  # blocks stored
    evicted: int = 0  # blocks evicted
    blocks: int = 0  # blocks held now
    bytes: int = 0  # bytes held now


@dataclass
class PrefixCache:
    """The cache of one engine (single-threaded, like the engine)."""

    pool: SlotPool
    block: int  # C: tokens per block (the engine's prefill chunk, or less where chunks are free)
    max_bytes: int
    stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)

    def __post_init__(self) -> None:
        if self.block < 1 or self.max_bytes < 0:
            raise ValueError(f"block must be >= 1 and max_bytes >= 0, got {self.block}, {self.max_bytes}")
        self._blocks: dict[tuple[object, tuple[int, ...]], PrefixBlock] = {}
        self._spare: list[list[list[torch.Tensor]]] = []  # evicted blocks' buffers, for the next stores
        self._ids = itertools.count()
        self._clock = itertools.count()

    @staticmethod
    def _root(namespace: str) -> tuple[str, str]:
        return ("namespace", namespace)

    def lookup(self, namespace: str, tokens: Sequence[int]) -> list[PrefixBlock]:
        """The cached blocks that ``tokens`` starts with (at most ``(len(tokens) - 1) // C``)."""
        self.stats.lookups += 1
        c = self.block
        found: list[PrefixBlock] = []
        parent: object = self._root(namespace)
        for i in range((len(tokens) - 1) // c):
            block = self._blocks.get((parent, tuple(int(t) for t in tokens[i * c:(i + 1) * c])))
            if block is None:
                break
            found.append(block)
            parent = block.id
        if found:
            now = next(self._clock)
            for b in found:
                b.last_used = now
            self.stats.hits += 1
            self.stats.hit_tokens += len(found) * c
        return found

    @torch.inference_mode()
    def load(self, slot: int, blocks: Sequence[PrefixBlock]) -> int:
        """Copy ``blocks`` (a chain from position 0) into ``slot``, which must be empty; returns the
        positions now in it. A sliding-window group gets only the blocks its window still needs."""
        if not blocks:
            return 0
        c, end = self.block, len(blocks) * self.block
        pool = self.pool
        if int(pool.length[slot]) != 0:
            raise ValueError("prefix blocks load into an empty slot")
        for g in pool.groups:  # where each group's entries start (block-aligned)
            first = 0 if g.window is None else max(0, end - (g.window - 1)) // c
            g.start[slot] = first * c
        pool.ensure(slot, end)
        for gi, g in enumerate(pool.groups):
            first = int(g.start[slot]) // c
            for i in range(first, len(blocks)):
                e0 = i * c - int(g.start[slot])
                for t, piece in zip(g.tensors, blocks[i].data[gi], strict=True):
                    t[:, slot, :, e0:e0 + c].copy_(piece)
        pool.length[slot] = end
        return end

    @torch.inference_mode()
    def store(self, namespace: str, parent: PrefixBlock | None, tokens: Sequence[int], slot: int,
              position: int) -> PrefixBlock | None:
        """Keep the block ``tokens`` that ``slot`` just prefilled at ``position`` (a multiple of C,
        after ``parent``'s block); returns it (the one already cached, if any), or None when the
        cache holds nothing (``max_bytes`` 0, or the block alone is larger)."""
        if len(tokens) != self.block or position % self.block or (parent is None) != (position == 0):
            raise ValueError("store() takes one whole block at a block boundary, after its parent")
        key = (parent.id if parent is not None else self._root(namespace), tuple(int(t) for t in tokens))
        block = self._blocks.get(key)
        now = next(self._clock)
        if block is not None:
            block.last_used = now
            return block
        views = []
        for g in self.pool.groups:
            e0 = position - int(g.start[slot])
            views.append([t[:, slot, :, e0:e0 + self.block] for t in g.tensors])
        nbytes = sum(v.numel() * v.element_size() for group in views for v in group)
        if nbytes > self.max_bytes:
            return None
        self._evict(self.max_bytes - nbytes, keep=parent)
        if parent is not None and self._blocks.get(parent.key) is not parent:
            return None  # its parent had to go: an orphan could never be found
        block = PrefixBlock(next(self._ids), parent, key, self._copy(views), nbytes, now)
        self._blocks[key] = block
        if parent is not None:
            parent.children += 1
        self.stats.stored += 1
        self.stats.blocks += 1
        self.stats.bytes += nbytes
        return block

    def _copy(self, views: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
        """The block's entries in buffers of their own: an evicted block's when one fits, else new."""
        def shape(group: list[torch.Tensor]) -> list[tuple[object, ...]]:
            return [(t.shape, t.dtype, t.device) for t in group]

        while self._spare:
            spare = self._spare.pop()
            if [shape(g) for g in spare] == [shape(g) for g in views]:
                for buffers, group in zip(spare, views, strict=True):
                    for buffer, view in zip(buffers, group, strict=True):
                        buffer.copy_(view)
                return spare
        return [[v.clone() for v in group] for group in views]

    def _evict(self, budget: int, keep: PrefixBlock | None) -> None:
        """Drop least recently used leaves (blocks no cached block hangs off) until at most
        ``budget`` bytes are held; ``keep``'s chain, being extended, stays."""
        protected = set()
        while keep is not None:
            protected.add(keep.id)
            keep = keep.parent
        while self.stats.bytes > budget:
            leaves = [b for b in self._blocks.values() if not b.children and b.id not in protected]
            if not leaves:
                break
            self._drop(min(leaves, key=lambda b: b.last_used))

    def _drop(self, block: PrefixBlock) -> None:
        del self._blocks[block.key]
        if len(self._spare) < 2:
            self._spare.append(block.data)
        block.data = []  # out of the cache: nothing reads it now (load() takes blocks just found)
        if block.parent is not None:
            block.parent.children -= 1
        self.stats.evicted += 1
        self.stats.blocks -= 1
        self.stats.bytes -= block.nbytes

    def clear(self) -> None:
        for block in list(self._blocks.values()):
            self._drop(block)
        self._spare.clear()
