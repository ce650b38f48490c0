"""Faster float32 linear layers on CPU: weights packed once, for the streaming kernel or oneDNN.

``torch.nn.functional.linear`` on CPU runs MKL ``sgemm`` on the weight as stored. For the shapes
decoding produces (1 to ~32 rows against a large weight) that path is slow, and pathologically so
for 2-3 rows (each row re-reads the weight). Two packed backends read the weight once per call:

- the streaming kernel (:mod:`.native.matmul`, ``matmul.c`` built on first use), where it builds
  (Linux on x86-64 with AVX2+FMA and a C compiler): rows ride along the weight stream almost for
  free up to a few dozen (``python -m tools bench-linear`` compares it with oneDNN), and a row's bits
  never depend on the other rows;
- oneDNN with the weight reordered ahead of time into its blocked layout, everywhere else (about
  twice MKL's speed at one row on an LM head, three times at 8 rows).

``LOOKUPSPEC_CPU_LINEAR`` (``auto``, ``stream``, ``onednn``) chooses; ``auto`` prefers the kernel.
Both are the same float32 arithmetic in another summation order, so logits differ from the unpacked
model's in the last bits (~1e-5 relative), exactly like a batched forward differs from a one-token
one; greedy tokens can differ only at float near-ties (see the real-model exactness tests).

:func:`pack_linears` swaps every ``nn.Linear`` of a model (in place) for a :class:`PackedLinear`.
Use it on a model that serves CPU float32 inference only: the packed weights are opaque (no
autograd, no ``state_dict``, no ``.to(device)``).

:class:`FusedLinears` runs packed layers that read one input (an attention block's q/k/v, an MLP's
gate/up) as one matmul over their stacked weights: one call instead of three or two, which is what
a decode step's few rows pay for (each oneDNN call has a fixed cost of tens of microseconds). Each
output column is still the same dot product; :meth:`FusedLinears.fuse` keeps a fusion only where a
probe shows the separate layers' outputs bit for bit (up to 200 rows). The lean forward uses it for
every forward, prompt chunks included (at 128-row chunks fused and separate layers take the same
time).

Batch invariance. A batched forward stacks the rows of many sequences into one product, so a row's
result must not depend on the other rows. The streaming kernel's does not, by construction. oneDNN's
packed products satisfy this for 2 rows and more (SmolLM2's shapes measured up to 400 rows at random
offsets; every load probes up to 300), but for some shapes a one-row product takes another kernel
and differs in the last bits (SmolLM2's 1536-wide down projection; MKL's plain ``sgemm`` differs at
almost every row count). :func:`single_row_differs` probes each shape once; a layer whose one-row
product differs runs it as two copies of the row (``pad_single``), which costs little (the weight is
read once either way) and makes every row count agree. The probe runs on either backend.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable, Sequence

import torch

from .native import matmul
from .native.quantized import QuantWeights

__all__ = ["FusedLinears", "PackedLinear", "QuantizedLinear", "linear_backend", "pack_linears",
           "packing_available", "single_row_differs"]

_BATCH_HINT = 8  # the row count oneDNN tunes the layout for; measured best for 1-32 rows here
_PROBE_ROWS = (1, 2, 3, 4, 5, 8, 13, 16, 24, 32, 48, 100, 136, 200)
# batch-invariance probe: products of these many rows (a prompt chunk of 128 rows and a step's decode
# rows share a forward, so the counts reach past the chunk)
_ROW_COUNTS = (2, 3, 5, 8, 13, 32, 100, 136, 300)


Product = Callable[[torch.Tensor], torch.Tensor]


class _OneDNNWeights:
    """A weight reordered for oneDNN (and its bias): ``self(x)`` is ``x @ W.T + b``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, batch_hint: int) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), batch_hint)
        self.bias = None if bias is None else bias.detach().clone()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")

    def dense(self) -> torch.Tensor:
        return self.packed.to_dense()


def linear_backend() -> str:
    """The backend new packed layers use: ``"stream"`` (:mod:`.native.matmul`) or ``"onednn"``."""
    return "stream" if matmul.kernel() is not None else "onednn"


Weights = _OneDNNWeights | matmul.StreamWeights


def _weights(weight: torch.Tensor, bias: torch.Tensor | None, batch_hint: int,
             lib: ctypes.CDLL | None) -> Weights:
    """``weight`` packed for the streaming kernel ``lib``, or for oneDNN when ``lib`` is None."""
    if lib is not None:
        return matmul.StreamWeights(lib, weight, bias)
    return _OneDNNWeights(weight, bias, batch_hint)


def _backend(weights: Weights) -> str:
    return "stream" if isinstance(weights, matmul.StreamWeights) else "onednn"


def _matmul(x: torch.Tensor, product: Product, pad_single: bool) -> torch.Tensor:
    """``product(x)``; with ``pad_single`` a one-row product is run as two copies of the row (see
    :func:`single_row_differs`)."""
    if pad_single and x.numel() == x.shape[-1]:
        y = product(x.reshape(1, -1).expand(2, -1).contiguous())
        return y[:1].reshape(*x.shape[:-1], y.shape[-1])
    return product(x)


_ROW_MEMO: dict[tuple, bool | None] = {}
# FusedLinears.fuse's probe verdicts: whether stacking parts of these shapes, for this backend,
# library and thread count, gives their outputs bit for bit (a property of the kernels and shapes)
_FUSE_MEMO: dict[tuple, bool] = {}
# FusedLinears alive, by the identities of their parts: engines built on one model share them
_FUSED: weakref.WeakValueDictionary[tuple, FusedLinears] = weakref.WeakValueDictionary()


def single_row_differs(product: Product, key: tuple, in_features: int) -> bool | None:
    """Whether a row's result depends on the other rows of the product (the batch-invariance probe).

    False: every row count gives a row the same bits. True: products of 2 or more rows agree with
    each other whatever the other rows are, but a one-row product takes another kernel and differs in
    the last bits (measured here for oneDNN's 1536-wide MLP down projection of SmolLM2), so one-row
    calls should run as two rows. None: results depend on the row count (padding cannot help).
    Kernel choice depends on the backend and shape only (``key``), so the answer is remembered."""
    if key not in _ROW_MEMO:
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(max(_ROW_COUNTS), in_features, generator=gen)
        with torch.no_grad():
            full = product(x)
            multi = all(torch.equal(product(x[:m]), full[:m]) for m in _ROW_COUNTS[:-1])
            multi = multi and torch.equal(product(x[7:10]), full[7:10])
            multi = multi and torch.equal(product(x[37:177]), full[37:177])
            single = torch.equal(product(x[:1]), full[:1])
        _ROW_MEMO[key] = None if not multi else not single
    return _ROW_MEMO[key]


def _onednn_available() -> bool:
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    return hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")


def packing_available() -> bool:
    """Whether float32 CPU layers can be packed: the streaming kernel builds here, or this torch
    build has the oneDNN linear ops (CPU builds with mkldnn do)."""
    return matmul.kernel() is not None or _onednn_available()


def _key(weights: Weights, in_features: int, out_features: int) -> tuple:
    return (_backend(weights), in_features, out_features, weights.bias is not None)


class PackedLinear(torch.nn.Module):
    """``y = x @ W.T + b`` with ``W`` packed for the streaming kernel or oneDNN (``backend``).
    Keeps ``in_features``/``out_features``."""

    def __init__(self, linear: torch.nn.Linear, batch_hint: int = _BATCH_HINT) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        with torch.no_grad():
            # a plain attribute, not a buffer: packed weights cannot be saved or moved like tensors
            self.weights = _weights(linear.weight, linear.bias, batch_hint, matmul.kernel())
        self.pad_single = bool(single_row_differs(self.weights, _key(self.weights, self.in_features,
                                                                     self.out_features), self.in_features))

    @property
    def bias(self) -> torch.Tensor | None:
        return self.weights.bias

    @property
    def backend(self) -> str:
        """``"stream"`` or ``"onednn"``: what the weights were packed for."""
        return _backend(self.weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _matmul(x, self.weights, self.pad_single)

    def dense_weight(self) -> torch.Tensor:
        """The weight in its ordinary ``[out_features, in_features]`` layout (a new tensor)."""
        return self.weights.dense()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed for {self.backend}"


class FusedLinears:
    """Packed linear layers that read the same input, run as one matmul (of their parts' backend)
    over their stacked weights: ``self(x)`` is ``cat([part(x) for part in parts], -1)`` bit for bit.
    Build it with :meth:`fuse`, which returns ``None`` where a probe finds any difference."""

    def __init__(self, parts: Sequence[PackedLinear], batch_hint: int = _BATCH_HINT) -> None:
        if len({p.backend for p in parts}) != 1:
            raise ValueError("cannot fuse layers packed for different backends")
        with torch.no_grad():
            stacked = torch.cat([p.dense_weight() for p in parts], dim=0).contiguous()
            has_bias = [p.bias is not None for p in parts]
            if any(has_bias) and not all(has_bias):
                raise ValueError("cannot fuse layers of which only some have a bias")
            bias = torch.cat([p.bias for p in parts]).contiguous() if all(has_bias) else None  # type: ignore[misc]
            first = parts[0].weights  # the parts' own library, whatever the environment says now
            lib = first.lib if isinstance(first, matmul.StreamWeights) else None
            self.weights: Weights = _weights(stacked, bias, batch_hint, lib)
        self.parts = tuple(parts)  # kept alive with the fusion, so their identities stay theirs
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.pad_single = bool(single_row_differs(self.weights, _key(self.weights, self.in_features,
                                                                     self.out_features), self.in_features))

    @property
    def bias(self) -> torch.Tensor | None:
        return self.weights.bias

    @classmethod
    def fuse(cls, parts: Sequence[PackedLinear], batch_hint: int = _BATCH_HINT) -> FusedLinears | None:
        """The parts as one product, or None where they cannot be fused or the probe finds a
        difference. The probe runs once a process for each backend, library, thread count and
        shapes (a model's layers share theirs); while a fusion of these very parts is alive (another
        engine on the same model holds it), that one is returned, not a second copy of the weights."""
        if len(parts) < 2 or len({p.in_features for p in parts}) != 1:
            return None
        if len({p.bias is None for p in parts}) != 1 or len({p.backend for p in parts}) != 1:
            return None
        key = (parts[0].backend, getattr(parts[0].weights, "lib", None), parts[0].in_features,
               tuple(p.out_features for p in parts), parts[0].bias is not None, batch_hint,
               torch.get_num_threads())
        if _FUSE_MEMO.get(key) is False:
            return None
        # a live fusion holds its parts, so while it is in _FUSED their ids are theirs alone
        ids = (tuple(map(id, parts)), batch_hint)
        fused = _FUSED.get(ids) or cls(parts, batch_hint)
        if key not in _FUSE_MEMO:
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                _FUSE_MEMO[key] = all(
                    torch.equal(fused(x), torch.cat([p(x) for p in parts], dim=-1))
                    for x in (torch.randn(1, rows, fused.in_features, generator=gen) for rows in _PROBE_ROWS))
        if not _FUSE_MEMO[key]:
            return None
        _FUSED[ids] = fused
        return fused

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _matmul(x, self.weights, self.pad_single)


def pack_linears(model: torch.nn.Module, batch_hint: int = _BATCH_HINT,
                 memo: dict[int, tuple[torch.nn.Linear, PackedLinear]] | None = None) -> int:
    """Replace every float32 CPU ``nn.Linear`` in ``model`` by a :class:`PackedLinear`; returns how
    many were replaced (0 when neither backend is available or the model is not float32 on CPU). A weight
    tied to an embedding (the LM head, often) is packed as a copy; the embedding keeps its own.
    Models sharing layers (a ``self:layers=K`` draft and its target) pass one ``memo`` so a shared
    ``nn.Linear`` is packed once and both end up holding the same :class:`PackedLinear`."""
    if not packing_available():
        return 0
    memo = {} if memo is None else memo
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (type(child) is torch.nn.Linear and child.weight.device.type == "cpu"
                    and child.weight.dtype == torch.float32):
                if id(child) not in memo:  # the entry keeps ``child`` alive, so its id stays its own
                    memo[id(child)] = (child, PackedLinear(child, batch_hint))
                setattr(parent, name, memo[id(child)][1])
                replaced += 1
    return replaced


class QuantizedLinear(torch.nn.Module):
    """``y = x @ W.T + b`` with ``W`` a GGUF-quantized tensor multiplied as it is
    (:mod:`.native.quantized`): the outputs of the streaming float32 kernel on gguf's dequantization
    of ``W``, bit for bit, from the quantized bytes. Keeps ``in_features``/``out_features``."""

    backend = "quantized"

    def __init__(self, weights: QuantWeights) -> None:
        super().__init__()
        self.weights = weights  # a plain attribute, as PackedLinear's
        self.in_features = weights.in_features
        self.out_features = weights.out_features

    @property
    def bias(self) -> torch.Tensor | None:
        return self.weights.bias

    @property
    def kind(self) -> str:
        """The GGUF type: ``"Q4_K"``, ``"Q8_0"``, ..."""
        return self.weights.kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weights(x)

    def dense_weight(self) -> torch.Tensor:
        """The dequantized weight ``[out_features, in_features]`` (a new float32 tensor)."""
        return self.weights.dense()

    @staticmethod
    def stack(parts: Sequence[QuantizedLinear]) -> QuantWeights | None:
        """Layers that read one input as one product over their stacked rows (each output the same
        chain, so the same bits as the separate layers), or None where their types or shapes do not
        allow it."""
        return QuantWeights.stack([p.weights for p in parts])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.kind}"
