"""Faster float32 linear layers on CPU: weights prepacked once for oneDNN.

``torch.nn.functional.linear`` on CPU runs MKL ``sgemm`` on the weight as stored. For the shapes
decoding produces (1 to ~32 rows against a large weight) that path is slow, and pathologically so
for 2-3 rows (each row re-reads the weight). oneDNN with the weight reordered ahead of time into
its blocked layout reads the weight once per call at any row count. Measured on the 2-core EPYC
these benchmarks run on, single thread, SmolLM2-135M shapes:

- LM head [49152 x 576]: 1 row 7.4 -> 3.9 ms, 8 rows 15.2 -> 4.8 ms;
- MLP [1536 x 576]: 1 row 55 -> 53 us, 8 rows 238 -> 92 us.

It is the same float32 arithmetic in another summation order, so logits differ from the unpacked
model's in the last bits (~1e-5 relative), exactly like a batched forward differs from a one-token
one; greedy tokens can differ only at float near-ties (see the real-model exactness tests).

:func:`pack_linears` swaps every ``nn.Linear`` of a model (in place) for a :class:`PackedLinear`.
Use it on a model that serves CPU float32 inference only: the packed weights are opaque oneDNN
tensors (no autograd, no ``state_dict``, no ``.to(device)``).
"""

from __future__ import annotations

import torch

__all__ = ["PackedLinear", "pack_linears", "packing_available"]

_BATCH_HINT = 8  # the row count oneDNN tunes the layout for; measured best for 1-32 rows here


def packing_available() -> bool:
    """Whether this torch build has the oneDNN linear ops (CPU builds with mkldnn do)."""
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    return hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")


class PackedLinear(torch.nn.Module):
    """``y = x @ W.T + b`` with ``W`` reordered for oneDNN. Keeps ``in_features``/``out_features``."""

    def __init__(self, linear: torch.nn.Linear, batch_hint: int = _BATCH_HINT) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        with torch.no_grad():
            weight = linear.weight.detach().contiguous()
            # a plain attribute, not a buffer: oneDNN tensors cannot be saved or moved like others
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)
            self.bias = None if linear.bias is None else linear.bias.detach().clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN-packed"


def pack_linears(model: torch.nn.Module, batch_hint: int = _BATCH_HINT,
                 memo: dict[int, tuple[torch.nn.Linear, PackedLinear]] | None = None) -> int:
    """Replace every float32 CPU ``nn.Linear`` in ``model`` by a :class:`PackedLinear`; returns how
    many were replaced (0 when oneDNN is unavailable or the model is not float32 on CPU). A weight
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
