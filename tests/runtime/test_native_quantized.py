"""The quantized matmul (``native/matmul.c``'s ``matmul_quant``): per GGUF type, its weights are
gguf's own dequantization bit for bit, and its products are the float32 kernel's on those weights
bit for bit, for 1 to 128 rows, odd shapes, with and without a bias, AVX-512 and AVX2 alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf_tiny import random_blocks

from lookupspec.runtime.cpu_linear import QuantizedLinear
from lookupspec.runtime.native import matmul
from lookupspec.runtime.native.quantized import QUANT_TYPES, QuantWeights, regroup

pytestmark = pytest.mark.skipif(
    matmul.kernel() is None, reason=f"the streaming kernel does not build here: {matmul.kernel_error()}")

KINDS = sorted(QUANT_TYPES)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _case(kind: str, rows: int, blocks: int, seed: int = 0) -> tuple[np.ndarray, int]:
    per_block = QUANT_TYPES[kind][1]
    rng = np.random.default_rng(seed)
    return random_blocks(kind, rows, blocks * per_block, rng), blocks * per_block


@pytest.mark.parametrize("kind", KINDS)
def test_the_weights_are_ggufs_dequantization_bit_for_bit(kind):
    import gguf

    raw, cols = _case(kind, 45, 3)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(45, cols)
    got = QuantWeights.from_gguf(matmul.kernel(), kind, raw, cols).dense()
    assert torch.equal(_bits(got), _bits(torch.from_numpy(want.astype(np.float32))))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("out_features", "blocks", "bias"), [(37, 2, True), (100, 3, False), (16, 1, True)])
def test_products_equal_the_float_kernels_on_the_dequantized_weights(kind, out_features, blocks, bias):
    lib = matmul.kernel()
    raw, cols = _case(kind, out_features, blocks, seed=out_features)
    b = torch.randn(out_features) if bias else None
    quant = QuantWeights.from_gguf(lib, kind, raw, cols, b)
    floats = matmul.StreamWeights(lib, quant.dense(), b)
    x = torch.randn(128, cols) * 3
    # in-register tiles up to 24 rows on AVX-512 (8 on AVX2), split in tiles of up to 8; the panel past that
    for rows in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 16, 17, 23, 24, 25, 33, 64, 128):
        assert torch.equal(_bits(quant(x[:rows])), _bits(floats(x[:rows]))), rows
    assert quant(x[:0]).shape == (0, out_features)
    assert torch.equal(quant(x[:6].view(2, 3, cols)), floats(x[:6]).view(2, 3, out_features))


@pytest.mark.parametrize("kind", ["Q8_0", "Q5_1", "Q6_K"])
def test_row_lookups_are_rows_of_the_dequantized_weight(kind):
    raw, cols = _case(kind, 50, 2)
    quant = QuantWeights.from_gguf(matmul.kernel(), kind, raw, cols)
    ids = torch.tensor([[0, 49, 17], [16, 15, 17]])
    assert torch.equal(quant.rows(ids), quant.dense()[ids])
    with pytest.raises(IndexError):
        quant.rows(torch.tensor([50]))


def test_stacked_layers_equal_their_parts_and_odd_row_counts_do_not_stack():
    lib = matmul.kernel()
    parts = [QuantWeights.from_gguf(lib, "Q4_K", _case("Q4_K", n, 2, seed=n)[0], 512) for n in (64, 32, 32)]
    stacked = QuantWeights.stack(parts)
    assert stacked is not None and stacked.out_features == 128
    x = torch.randn(9, 512)
    assert torch.equal(stacked(x), torch.cat([p(x) for p in parts], dim=-1))
    eight_rows = QuantWeights.from_gguf(lib, "Q4_K", _case("Q4_K", 8, 2)[0], 512)
    other_type = QuantWeights.from_gguf(lib, "Q6_K", _case("Q6_K", 32, 2)[0], 512)
    assert QuantWeights.stack([parts[0], eight_rows]) is None
    assert QuantWeights.stack([parts[0], other_type]) is None


def test_the_planes_take_about_the_files_bytes():
    for kind in KINDS:
        raw, cols = _case(kind, 64, 2)
        planes = regroup(kind, raw, cols)
        size = sum(p.nbytes for p in planes.values())
        assert raw.nbytes <= size <= 1.05 * raw.nbytes, kind


def test_avx2_and_avx512_builds_give_the_same_bits():
    lib = matmul.kernel()
    avx2 = matmul._LIBRARY.build("haswell")  # into the shared kernel cache
    assert avx2.matmul_isa() == 256
    x = torch.randn(20, 512)
    for kind in KINDS:
        raw, cols = _case(kind, 40, 512 // QUANT_TYPES[kind][1])
        a, b = QuantWeights.from_gguf(lib, kind, raw, cols), QuantWeights.from_gguf(avx2, kind, raw, cols)
        assert torch.equal(a.dense(), b.dense())
        for rows in (1, 4, 6, 11, 20, 24, 25):
            assert torch.equal(_bits(a(x[:rows])), _bits(b(x[:rows]))), (kind, rows)


def test_bad_shapes_are_refused():
    raw, cols = _case("Q8_0", 4, 2)
    with pytest.raises(ValueError, match="multiple of 32"):
        regroup("Q8_0", raw, 48)
    with pytest.raises(ValueError, match="bytes"):
        regroup("Q8_0", raw[:, :-1], cols)
    with pytest.raises(ValueError, match="no quantized kernel"):
        regroup("IQ2_XS", raw, cols)
    quant = QuantWeights.from_gguf(matmul.kernel(), "Q8_0", raw, cols)
    with pytest.raises(ValueError, match="features"):
        quant(torch.randn(2, cols + 1))
    with pytest.raises(TypeError):
        quant(torch.randn(2, cols, dtype=torch.float64))


def test_a_deep_copied_quantized_layer_shares_its_planes_and_gives_the_same_bits():
    """``lookupspec bench`` deep-copies the model per system; a quantized layer holds a ctypes library."""
    import copy

    raw, cols = _case("Q4_0", 32, 2)
    weights = QuantWeights.from_gguf(matmul.kernel(), "Q4_0", raw, cols, torch.randn(32))
    clone = copy.deepcopy(torch.nn.ModuleDict({"w": QuantizedLinear(weights)}))["w"].weights
    assert clone.planes is weights.planes and clone.lib is weights.lib
    x = torch.randn(3, cols)
    assert torch.equal(clone(x), weights(x))
