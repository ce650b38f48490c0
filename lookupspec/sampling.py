"""Sampling parameters, logits processing and position-keyed Gumbel noise.

Every token lookupspec emits, speculative or not, is chosen by one rule:

    token = argmax(processed_logits + g)        # g = 0 when greedy

where ``processed_logits`` are the target logits divided by the temperature with the top-k / top-p
filtered entries set to ``-inf`` (``argmax(l / T + g)`` equals ``argmax(log softmax(l / T) + g)``:
the log-normaliser is a constant per row), and ``g`` is Gumbel noise that is a *pure function* of
``(seed, absolute position, token id)``. Because the noise does not depend on how many forwards
produced the logits, a seeded request yields the same tokens with speculation on or off, and the
Triton verification kernels can regenerate it in-kernel from the same integer hash.

The hash (``hash32``) is the "lowbias32" integer finaliser (two xor-shift-multiply rounds), used in
three nested rounds so that neighbouring seeds, positions and tokens give unrelated streams::

    key(seed, pos)      = hash32(hash32(fold(seed) ^ 0x9E3779B9) ^ (pos mod 2**32))
    bits(seed, pos, t)  = hash32(key ^ (t * 0x85EBCA6B mod 2**32))
    u                   = ((bits >> 9) + 0.5) / 2**23          # in (0, 1), exact in float32
    g                   = -log(-log(u))

Worked example: ``hash32(0) == 0``; ``hash32(1) == 0x688990C0`` (kept as a regression check in the
tests). Top-p keeps token ``i`` iff the probability mass of tokens *strictly more likely* than ``i``
is below ``top_p``: the smallest nucleus with mass >= top_p, with every token tied at its boundary
kept (a sort-free rule that a kernel can evaluate exactly; it differs from a sort-based nucleus only
on exact probability ties). The most likely token is always kept: ``top_p`` below float32's resolution
is raised to ``MIN_TOP_P``, where the nucleus is that token alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

__all__ = [
    "GREEDY_EPS",
    "MIN_TOP_P",
    "SamplingParams",
    "gumbel_noise",
    "hash32",
    "hash32_int",
    "position_keys",
    "process_logits",
    "select_tokens",
]

# Temperatures below this are greedy (vLLM uses the same threshold): dividing by them overflows.
GREEDY_EPS = 1e-5
# The smallest top_p the filters see: float32's smallest normal number. The filters compare in float32,
# where a smaller top_p (1e-46, 5e-324) rounds to 0 (or, on a device that flushes subnormals, may),
# and "mass above >= 0" would filter every token, the most likely one included: the argmax of an
# all -inf row is token 0 whatever the logits. At this floor the nucleus is the most likely token (and
# its exact ties), as for any top_p below the top probability; every larger top_p is unchanged.
MIN_TOP_P = 2.0**-126

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
_TOKEN_MUL = 0x85EBCA6B


@dataclass(frozen=True)
class SamplingParams:
    """How one request turns logits into tokens. ``temperature`` 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0) or self.temperature != self.temperature:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_p < MIN_TOP_P:
            object.__setattr__(self, "top_p", MIN_TOP_P)
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    def with_seed(self) -> SamplingParams:
        """A copy with a concrete seed (drawn from the OS when none was given)."""
        if self.seed is not None:
            return self
        seed = int.from_bytes(os.urandom(8), "little") >> 1
        return SamplingParams(self.temperature, self.top_k, self.top_p, seed)


def hash32_int(x: int) -> int:
    """Plain-Python reference of :func:`hash32` (the tests pit the two against each other)."""
    x &= _M32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _M32
    x ^= x >> 16
    return x


def hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding values in [0, 2**32). Wrapping int64 products keep the
    low 32 bits exact, which is all the masks below keep."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    x = x ^ (x >> 16)
    return x


def _fold_seed(seed: int) -> int:
    return (seed ^ (seed >> 32)) & _M32


def position_keys(seed: int, positions: torch.Tensor) -> torch.Tensor:
    """Per-position stream keys. positions: [n] int64 absolute positions -> [n] int64 in [0, 2**32)."""
    base = hash32_int(_fold_seed(seed) ^ _GOLDEN)
    return hash32(positions.to(torch.int64) ^ base)


def gumbel_noise(seed: int, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise keyed by (seed, position, token). positions: [n] -> [n, vocab] float32."""
    keys = position_keys(seed, positions)  # integer hashing: the same bits on every device
    tokens = (torch.arange(vocab_size, device=positions.device, dtype=torch.int64) * _TOKEN_MUL) & _M32
    bits = hash32(keys[:, None] ^ tokens[None, :])  # [n, vocab]
    # 23 bits: k + 0.5 is exact in float32, so u < 1 and the noise is finite (24 bits would round
    # the top value to exactly 1.0 and give +inf noise, which would beat any probability).
    u = ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))
    return -torch.log(-torch.log(u))


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p. logits: [n, vocab] -> [n, vocab] float32 with filtered
    entries at -inf. Not used for greedy rows (greedy is a plain argmax of the raw logits)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [n, vocab], got shape {tuple(logits.shape)}")
    scores = logits.float() / max(params.temperature, GREEDY_EPS)
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        probs = torch.softmax(scores, dim=-1)
        sorted_probs, _ = torch.sort(probs, dim=-1, descending=True)
        # mass strictly above a probability value = exclusive cumsum at its first occurrence
        exclusive = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        # first index (in descending order) of each token's probability value
        first = torch.searchsorted(-sorted_probs.contiguous(), -probs.contiguous(), side="left")
        mass_above = torch.gather(exclusive, -1, first)
        scores = scores.masked_fill(mass_above >= params.top_p, float("-inf"))
    return scores


def select_tokens(logits: torch.Tensor, params: SamplingParams, positions: torch.Tensor) -> torch.Tensor:
    """The target's token at each row. logits: [n, vocab]; positions: [n] absolute positions of the
    tokens being chosen -> [n] int64. Requires a concrete seed when sampling."""
    if params.greedy:
        return torch.argmax(logits, dim=-1)
    if params.seed is None:
        raise ValueError("sampling needs a concrete seed: call SamplingParams.with_seed() first")
    scores = process_logits(logits, params)
    return torch.argmax(scores + gumbel_noise(params.seed, positions, scores.shape[-1]), dim=-1)


# --- Noise streams for rejection sampling and draft sampling --------------------------------------
# (Added with verify.py and the Triton kernels; nothing above changes.)
#
# Stream 0 is the sample-and-match Gumbel noise above (``position_keys`` / ``gumbel_noise``). The
# other streams re-key the same (seed, position) so that rejection sampling's acceptance uniforms, its
# recovery draws and a draft model's own sampling are independent of stream 0 and of each other:
#
#     base_s(seed)   = hash32(hash32(fold(seed) ^ 0x9E3779B9) ^ s)       # s > 0
#     key_s(seed, p) = hash32(base_s ^ (p mod 2**32))
#     bits           = hash32(key_s ^ (t * 0x85EBCA6B mod 2**32))       # t = token (0 for a scalar)
#     u              = ((bits >> 9) + 0.5) / 2**23                     # in (0, 1), exact in float32
#
# Every stream, stream 0 included, keeps 23 bits so that ``k + 0.5`` is exact in float32 and ``u``
# never rounds to 1 (the noise stays finite).

STREAM_ACCEPT = 1  # one uniform per position: accept a sampled draft token iff u * q(x) <= p(x)
STREAM_RECOVER = 2  # Exp(1) per (position, token): the recovered token's exponential race
STREAM_DRAFT = 3  # Exp(1) per (position, token): for a draft model sampling its own chain

__all__ += [  # appended so that the block above stays untouched
    "STREAM_ACCEPT",
    "STREAM_DRAFT",
    "STREAM_RECOVER",
    "accept_uniforms",
    "exponential_from_keys",
    "gumbel_from_keys",
    "stream_keys",
]


def stream_keys(seeds: torch.Tensor, positions: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """Per-row stream keys, one seed per row. seeds: [n] int64 >= 0; positions: [n] int64 absolute
    positions -> [n] int64 in [0, 2**32). Stream 0 equals :func:`position_keys` row by row."""
    if seeds.shape != positions.shape or seeds.dim() != 1:
        raise ValueError(f"seeds and positions must both be [n], got {tuple(seeds.shape)}, "
                         f"{tuple(positions.shape)}")
    seeds = seeds.to(torch.int64)
    base = hash32(((seeds ^ (seeds >> 32)) & _M32) ^ _GOLDEN)
    if stream:
        base = hash32(base ^ stream)
    return hash32(positions.to(torch.int64) ^ base)


def gumbel_from_keys(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Stream-0 Gumbel noise from per-row keys: keys [n] -> [n, vocab] float32. The same arithmetic as
    :func:`gumbel_noise`, so ``gumbel_from_keys(stream_keys(s, p), V) == gumbel_noise(seed, p, V)``."""
    tokens = (torch.arange(vocab_size, device=keys.device, dtype=torch.int64) * _TOKEN_MUL) & _M32
    bits = hash32(keys[:, None] ^ tokens[None, :])  # [n, vocab]
    return -torch.log(-torch.log(_uniform23(bits)))


def _uniform23(bits: torch.Tensor) -> torch.Tensor:
    return ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def accept_uniforms(keys: torch.Tensor) -> torch.Tensor:
    """One uniform in (0, 1) per row (token 0 of the row's stream). keys: [n] -> [n] float32."""
    return _uniform23(hash32(keys))


def exponential_from_keys(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Exp(1) noise per (row, token) for exponential races: ``argmax(w / E)`` picks token ``j`` with
    probability ``w_j / sum(w)``. keys: [n] -> [n, vocab] float32, finite and > 0."""
    tokens = (torch.arange(vocab_size, device=keys.device, dtype=torch.int64) * _TOKEN_MUL) & _M32
    bits = hash32(keys[:, None] ^ tokens[None, :])  # [n, vocab]
    return -torch.log(_uniform23(bits))
