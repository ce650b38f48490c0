"""GGUF-quantized linear weights multiplied as they are, by ``matmul_quant`` (``matmul_quant.h``).

A GGUF tensor of type Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K stores each weight row as
blocks of 32 or 256 values: small integers and a float16 scale (and minimum) per block or sub-block.
:func:`regroup` turns a tensor's raw blocks ``[rows, row_bytes]`` into the kernel's planes: the same
fields, about the same bytes (the 6-bit K-quant scales take a byte each), ordered so that the k-th
values of 16 consecutive rows are adjacent. ``matmul_quant`` dequantizes 16 rows at a time with
gguf's own float32 operations (``gguf.quants``: e.g. ``(d * sc) * q - dmin * m`` for Q4_K), in
registers right before the multiply-adds for up to 8 rows, or into a cache-sized buffer that the
float32 kernel's tiles run over for more. So a product's every output is, bit for bit, what the
float32 kernel gives on the weights gguf dequantizes, while a step reads the quantized bytes from
memory instead of four per weight.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from .matmul import product_buffers

__all__ = ["QUANT_TYPES", "QuantWeights", "regroup"]

# GGUF type name -> (the kernel's type id, values per block, bytes per block)
QUANT_TYPES: dict[str, tuple[int, int, int]] = {
    "Q8_0": (0, 32, 34), "Q4_0": (1, 32, 18), "Q4_1": (2, 32, 20), "Q5_0": (3, 32, 22),
    "Q5_1": (4, 32, 24), "Q4_K": (5, 256, 144), "Q5_K": (6, 256, 176), "Q6_K": (7, 256, 210),
}
_PLANES = ("q", "hb", "d", "dm", "sc", "mn")
_WORDS = ("Q4_0", "Q4_1", "Q4_K")  # 4-bit values with no high bits: the q plane in words (matmul_quant.h)


def _f16(b: np.ndarray) -> np.ndarray:
    """[.., 2] bytes -> [..] float16 bit patterns (uint16)."""
    return np.ascontiguousarray(b).view(np.uint16)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[.., 16] bytes -> [.., 32] values: the low nibbles, then the high ones (legacy blocks)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of 6-bit scales and mins -> ([.., 8], [.., 8]) (as gguf unpacks them)."""
    d, m, m_d = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _fields(kind: str, blocks: np.ndarray) -> dict[str, np.ndarray]:
    """One tensor's blocks [rows, nb, bytes] -> its fields: ``q`` [rows, K] (the unsigned values
    before gguf's offset; int8 for Q8_0), ``d``/``dm`` [rows, nb] (float16 bits), ``sc``/``mn``
    [rows, sub-blocks] (int8)."""
    rows, nb, _ = blocks.shape
    out: dict[str, np.ndarray] = {}
    if kind == "Q8_0":
        out["d"], out["q"] = _f16(blocks[..., 0:2]), blocks[..., 2:34].view(np.int8)
    elif kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        at = 2
        out["d"] = _f16(blocks[..., 0:2])
        if kind in ("Q4_1", "Q5_1"):
            out["dm"], at = _f16(blocks[..., 2:4]), 4
        q = None
        if kind in ("Q5_0", "Q5_1"):
            qh = np.ascontiguousarray(blocks[..., at:at + 4]).view(np.uint32)  # [rows, nb, 1]
            q = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
            at += 4
        low = _nibbles(blocks[..., at:at + 16])
        out["q"] = low if q is None else low | q
    elif kind in ("Q4_K", "Q5_K"):
        out["d"], out["dm"] = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
        sc, mn = _scale_min(blocks[..., 4:16])
        out["sc"], out["mn"] = sc.view(np.int8), mn.view(np.int8)
        qs = blocks[..., -128:].reshape(rows, nb, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(2, 1)
        q = (qs & 0x0F).reshape(rows, nb, 8, 32)
        if kind == "Q5_K":
            qh = blocks[..., 16:48].reshape(rows, nb, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)
            q = q | ((qh & 1) << 4)
        out["q"] = q
    elif kind == "Q6_K":
        ql = blocks[..., 0:128].reshape(rows, nb, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(2, 1)
        shifts = np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)
        qh = blocks[..., 128:192].reshape(rows, nb, 2, 1, 32) >> shifts
        out["q"] = (ql & 0x0F).reshape(rows, nb, 256) | ((qh & 0x03).reshape(rows, nb, 256) << 4)
        out["sc"] = blocks[..., 192:208].view(np.int8)
        out["d"] = _f16(blocks[..., 208:210])
    else:
        raise ValueError(f"no quantized kernel for {kind}")
    out["q"] = out["q"].reshape(rows, -1)
    for name in ("sc", "mn"):
        if name in out:
            out[name] = out[name].reshape(rows, -1)
    return out


def _grouped(a: np.ndarray) -> np.ndarray:
    """[rows, X] (rows a multiple of 16) -> [rows / 16, X, 16]: each group's 16 rows innermost."""
    return np.ascontiguousarray(a.reshape(-1, 16, a.shape[1]).transpose(0, 2, 1))


def regroup(kind: str, raw: np.ndarray, in_features: int) -> dict[str, np.ndarray]:
    """A GGUF tensor's raw blocks ``raw`` [rows, row_bytes] (uint8) -> the planes ``matmul_quant``
    reads (``matmul.c`` describes them), the rows padded with zeros to a multiple of 16."""
    if kind not in QUANT_TYPES:
        raise ValueError(f"no quantized kernel for {kind}")
    _, per_block, nbytes = QUANT_TYPES[kind]
    if raw.dtype != np.uint8 or raw.ndim != 2 or in_features % per_block:
        raise ValueError(f"{kind}: expected uint8 [rows, row_bytes] over a multiple of {per_block} values")
    rows = raw.shape[0]
    nb = in_features // per_block
    if raw.shape[1] != nb * nbytes:
        raise ValueError(f"{kind}: rows of {raw.shape[1]} bytes for {in_features} values")
    pad = -rows % 16
    if pad:
        raw = np.concatenate([raw, np.zeros((pad, raw.shape[1]), np.uint8)])
    f = _fields(kind, raw.reshape(rows + pad, nb, nbytes))
    q = f["q"]
    planes: dict[str, np.ndarray] = {}
    if kind == "Q8_0":
        planes["q"] = _grouped(q.view(np.int8))
    elif kind in _WORDS:  # 32-bit words, nibble t of word j holding value 8j + t
        v = q.astype(np.uint32).reshape(q.shape[0], -1, 8) << (4 * np.arange(8, dtype=np.uint32))
        planes["q"] = _grouped(np.bitwise_or.reduce(v, axis=-1)).view(np.int32)
    else:
        low = (q & 0x0F).reshape(q.shape[0], -1, 2, 16)  # k = 32 c + 16 h + i
        planes["q"] = _grouped((low[:, :, 0] | (low[:, :, 1] << 4)).reshape(q.shape[0], -1)).view(np.int8)
        high = (q >> 4).astype(np.uint8)
        if kind in ("Q5_0", "Q5_1", "Q5_K"):
            bits = high.reshape(q.shape[0], -1, 8) << np.arange(8, dtype=np.uint8)
            planes["hb"] = _grouped(np.bitwise_or.reduce(bits, axis=-1))
        elif kind == "Q6_K":
            bits = high.reshape(q.shape[0], -1, 4) << np.array([0, 2, 4, 6], np.uint8)
            planes["hb"] = _grouped(np.bitwise_or.reduce(bits, axis=-1))
    for name in ("d", "dm", "sc", "mn"):
        if name in f:
            planes[name] = _grouped(f[name])
    return planes


@dataclass
class QuantWeights:
    """A quantized weight ``[out_features, in_features]`` (and a float32 bias) in ``matmul_quant``'s
    planes: ``self(x)`` is ``x @ W.T + b`` over the last dimension of ``x``, with ``W`` gguf's
    dequantization of the tensor."""

    lib: ctypes.CDLL
    kind: str
    out_features: int
    in_features: int
    planes: dict[str, torch.Tensor]
    bias: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # the kernel's arguments that never change (the planes are not written after load): a
        # decode step makes ~120 products, so each call should only add the input and output
        self._fixed = (*self._pointers(), QUANT_TYPES[self.kind][0], self.out_features,
                       None if self.bias is None else self.bias.data_ptr())

    @classmethod
    def from_gguf(cls, lib: ctypes.CDLL, kind: str, raw: np.ndarray, in_features: int,
                  bias: torch.Tensor | None = None) -> QuantWeights:
        planes = {k: torch.from_numpy(v.view(np.int16) if v.dtype == np.uint16 else v)
                  for k, v in regroup(kind, raw, in_features).items()}
        b = None if bias is None else bias.detach().to(torch.float32).contiguous().clone()
        return cls(lib, kind, raw.shape[0], in_features, planes, b)

    def __deepcopy__(self, memo: dict) -> QuantWeights:
        """A copy that shares the planes (never written after load) and the loaded library (a process
        resource, not copyable): a deep-copied model, as ``lookupspec bench`` makes for each system,
        holds the same bytes once."""
        return QuantWeights(self.lib, self.kind, self.out_features, self.in_features, self.planes, self.bias)

    @property
    def nbytes(self) -> int:
        """Resident bytes: the planes and the bias."""
        size = sum(t.numel() * t.element_size() for t in self.planes.values())
        return size + (0 if self.bias is None else self.bias.numel() * 4)

    def _pointers(self) -> list[int | None]:
        return [self.planes[n].data_ptr() if n in self.planes else None for n in _PLANES]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x2, y = product_buffers(x, self.in_features, self.out_features, "the quantized matmul")
        if x2.shape[0]:
            self.lib.matmul_quant(x2.data_ptr(), x2.shape[0], self.in_features, *self._fixed, y.data_ptr(),
                                  torch.get_num_threads())
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def dense(self) -> torch.Tensor:
        """The dequantized weight ``[out_features, in_features]`` (a new float32 tensor)."""
        out = torch.empty(self.out_features, self.in_features)
        self.lib.matmul_quant_dequant(*self._pointers(), QUANT_TYPES[self.kind][0], self.out_features,
                                      self.in_features, out.data_ptr())
        return out

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of the dequantized weight, ``[*ids.shape, in_features]``: an embedding lookup."""
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.out_features):
            raise IndexError(f"row ids outside [0, {self.out_features})")
        out = torch.empty(flat.numel(), self.in_features)
        self.lib.matmul_quant_rows(*self._pointers(), QUANT_TYPES[self.kind][0], self.in_features,
                                   flat.data_ptr(), flat.numel(), out.data_ptr())
        return out.reshape(*ids.shape, self.in_features)

    @staticmethod
    def stack(parts: list[QuantWeights]) -> QuantWeights | None:
        """The parts as one weight (their rows one after another), or None where they cannot be
        stacked: different types or inputs, or a part whose rows are not whole groups of 16."""
        first = parts[0]
        if any(p.kind != first.kind or p.in_features != first.in_features or p.out_features % 16
               for p in parts):
            return None
        if len({p.bias is None for p in parts}) != 1:
            return None
        planes = {n: torch.cat([p.planes[n] for p in parts]) for n in first.planes}
        bias = None if first.bias is None else torch.cat([p.bias for p in parts])  # type: ignore[misc]
        return QuantWeights(first.lib, first.kind, sum(p.out_features for p in parts), first.in_features,
                            planes, bias)
