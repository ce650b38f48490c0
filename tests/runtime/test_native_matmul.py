"""The streaming float32 matmul (native/matmul.c): right to float32 rounding, and batch-invariant bit for bit:
a row's result never depends on the other rows, their number, the tiling or the thread count."""

from __future__ import annotations

import pytest
import torch

from lookupspec.runtime.cpu_linear import FusedLinears, PackedLinear, linear_backend
from lookupspec.runtime.native import matmul
from lookupspec.runtime.native.loader import LazyLibrary

needs_kernel = pytest.mark.skipif(
    matmul.kernel() is None, reason=f"the streaming kernel does not build here: {matmul.kernel_error()}")


def _weights(n: int, k: int, bias: bool, seed: int = 0) -> matmul.StreamWeights:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) / k**0.5
    b = torch.randn(n, generator=gen) if bias else None
    lib = matmul.kernel()
    assert lib is not None
    return matmul.StreamWeights(lib, w, b)


@needs_kernel
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("n", "k"), [(1, 1), (7, 5), (16, 64), (97, 33), (960, 576), (576, 1536)])
@pytest.mark.parametrize("m", [1, 2, 3, 6, 7, 11, 13, 25, 30, 137])
def test_it_computes_x_times_w_transposed_plus_b(m, n, k, bias) -> None:
    sw = _weights(n, k, bias)
    x = torch.randn(m, k)
    want = x.double() @ sw.dense().double().T
    if bias:
        want += sw.bias.double()
    got = sw(x)
    assert got.shape == (m, n) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * k**0.5)


@needs_kernel
def test_a_rows_bits_do_not_depend_on_the_other_rows_or_the_threads() -> None:
    sw = _weights(200, 96, bias=True)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(300, 96, generator=gen)
    full = sw(x)
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            assert torch.equal(sw(x), full)
            # 9-12 rows take one 2-block tile on AVX-512, 7-8 and 13+ 3-block tiles
            for start, stop in ((0, 1), (5, 6), (7, 10), (10, 18), (18, 27), (40, 52), (60, 71), (1, 25),
                                (30, 62), (37, 177), (299, 300)):
                assert torch.equal(sw(x[start:stop]), full[start:stop]), (t, start, stop)
    finally:
        torch.set_num_threads(threads)
    # columns: a layer of the first 40 outputs gives the same bits as those columns of the whole
    part = matmul.StreamWeights(sw.lib, sw.dense()[:40], sw.bias[:40])
    assert torch.equal(part(x), full[:, :40])


@needs_kernel
def test_packing_round_trips_and_inputs_are_checked() -> None:
    w = torch.randn(37, 19)
    lib = matmul.kernel()
    assert lib is not None
    sw = matmul.StreamWeights(lib, w, None)
    assert torch.equal(sw.dense(), w)
    assert sw(torch.randn(2, 3, 19)).shape == (2, 3, 37)
    assert sw(torch.randn(0, 19)).shape == (0, 37)
    x = torch.randn(4, 19)
    assert torch.equal(sw(x.T.contiguous().T), sw(x))  # a strided input gives the same result
    with pytest.raises(ValueError, match="19"):
        sw(torch.randn(2, 18))
    with pytest.raises(TypeError, match="float32"):
        sw(torch.randn(2, 19, dtype=torch.float64))
    with pytest.raises(TypeError, match="autograd"):
        sw(torch.randn(2, 19, requires_grad=True))


@needs_kernel
def test_packed_layers_use_it_by_default_and_onednn_when_told(monkeypatch) -> None:
    lin = torch.nn.Linear(64, 40)
    assert linear_backend() == "stream"
    assert PackedLinear(lin).backend == "stream"
    monkeypatch.setenv("LOOKUPSPEC_CPU_LINEAR", "onednn")
    onednn = PackedLinear(lin)
    assert onednn.backend == "onednn" and linear_backend() == "onednn"
    monkeypatch.setenv("LOOKUPSPEC_CPU_LINEAR", "stream")
    stream, other = PackedLinear(lin), PackedLinear(torch.nn.Linear(64, 8))
    assert stream.backend == other.backend == "stream"
    assert FusedLinears.fuse([onednn, stream]) is None  # never fused across backends
    monkeypatch.setenv("LOOKUPSPEC_CPU_LINEAR", "onednn")  # fusion follows the parts, not the setting
    fused = FusedLinears.fuse([stream, other])
    assert fused is not None and isinstance(fused.weights, matmul.StreamWeights)
    monkeypatch.setenv("LOOKUPSPEC_CPU_LINEAR", "fastest")
    with pytest.raises(ValueError, match="LOOKUPSPEC_CPU_LINEAR"):
        PackedLinear(lin)


def test_a_failed_build_falls_back_to_onednn_or_fails_when_asked_for(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(matmul, "_LIBRARY", LazyLibrary(matmul._SOURCE, matmul._declare,
                                                          "LOOKUPSPEC_CPU_LINEAR", on="stream", off="onednn",
                                                          fallback="oneDNN"))
    monkeypatch.setenv("LOOKUPSPEC_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setenv("LOOKUPSPEC_CPU_LINEAR", "auto")
    assert matmul.kernel() is None
    assert matmul.kernel_error() is not None
    assert PackedLinear(torch.nn.Linear(8, 8)).backend == "onednn"
    monkeypatch.setenv("LOOKUPSPEC_CPU_LINEAR", "stream")
    with pytest.raises(RuntimeError, match="could not be built"):
        matmul.kernel()


@needs_kernel
def test_the_avx2_build_gives_the_same_bits() -> None:
    """Each output is the same per-lane fma chain on 8 or 16 lanes, so an AVX2 build (for CPUs
    without AVX-512) must agree bit for bit with whatever this machine built."""
    native = matmul.kernel()
    assert native is not None
    avx2 = matmul._LIBRARY.build("haswell")  # into the shared kernel cache
    assert avx2.matmul_isa() == 256
    gen = torch.Generator().manual_seed(5)
    w, b = torch.randn(131, 77, generator=gen), torch.randn(131, generator=gen)
    x = torch.randn(41, 77, generator=gen)
    for lib in (native, avx2):
        assert torch.equal(matmul.StreamWeights(lib, w, b).dense(), w)
    want = matmul.StreamWeights(native, w, b)(x)
    for m in (1, 2, 3, 7, 8, 9, 10, 41):  # AVX2 tiles change past 8 rows; the bits must not
        assert torch.equal(matmul.StreamWeights(avx2, w, b)(x[:m]), want[:m]), m


@needs_kernel
def test_it_runs_on_torchs_openmp_runtime_not_a_second_one() -> None:
    """Loaded after torch, the kernel's libgomp dependency resolves to the copy torch already loaded
    (same soname), so its threads are torch's: a second OpenMP pool would fight torch's spinning
    workers for the same cores."""
    with open("/proc/self/maps", encoding="utf-8") as f:
        gomp = {line.split()[-1] for line in f if "libgomp" in line}
    assert len(gomp) == 1, gomp
