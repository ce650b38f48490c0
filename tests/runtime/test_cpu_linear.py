"""Packed linear layers (the streaming kernel and oneDNN) compute what nn.Linear computes (up to
float32 summation order), at every row count decoding uses, and a packed tiny model decodes the same
tokens as the stock one."""

from __future__ import annotations

import pytest
import torch

from lookupspec.runtime.cpu_linear import (
    FusedLinears,
    PackedLinear,
    linear_backend,
    pack_linears,
    packing_available,
)

pytestmark = pytest.mark.skipif(not packing_available(), reason="no packed backend here")


@pytest.fixture(params=["stream", "onednn"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each packed backend in turn (the streaming kernel is skipped where it does not build)."""
    monkeypatch.setenv("LOOKUPSPEC_CPU_LINEAR", request.param)
    try:
        available = linear_backend() == request.param
    except RuntimeError:  # LOOKUPSPEC_CPU_LINEAR=stream where the kernel does not build
        available = False
    if not available:
        pytest.skip(f"the {request.param} backend is not available here")
    return request.param


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 64), (3, 64), (1, 7, 64), (2, 33, 64), (1, 300, 64)])
def test_packed_linear_matches_nn_linear(shape, bias, backend) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 96, bias=bias)
    packed = PackedLinear(lin)
    assert packed.backend == backend
    x = torch.randn(*shape)
    with torch.inference_mode():
        want, got = lin(x), packed(x)
        strided = packed(torch.randn(shape[-1], *shape[:-1]).movedim(0, -1))  # non-contiguous input
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert strided.shape == want.shape


def test_pack_linears_replaces_every_linear_but_keeps_embeddings(tiny_models) -> None:
    from lookupspec.models import load_model

    loaded = load_model(str(tiny_models["tiny-llama"]))
    model = loaded.model
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    embed = model.get_input_embeddings().weight
    assert pack_linears(model) == n_linear > 0
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert model.get_input_embeddings().weight is embed  # a tied LM head is packed as a copy
    assert pack_linears(model) == 0  # idempotent


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_packed_model_logits_and_greedy_tokens_match_the_stock_model(tiny_models, name, backend) -> None:
    from lookupspec.engine import Engine
    from lookupspec.models import load_model
    from lookupspec.params import GenerationParams, SpecParams

    stock = load_model(str(tiny_models[name])).model
    packed = load_model(str(tiny_models[name])).model
    pack_linears(packed)
    ids = torch.arange(3, 40)[None, :]
    with torch.inference_mode():
        torch.testing.assert_close(packed(ids).logits, stock(ids).logits, rtol=1e-4, atol=1e-4)
    params = GenerationParams(max_tokens=48, ignore_eos=True)
    prompt = list(range(5, 30))
    runs = [[t for s in Engine(m).generate(prompt, params, spec=SpecParams(enabled=False)) for t in s.tokens]
            for m in (stock, packed)]
    assert runs[0] == runs[1]


def test_a_derived_layers_draft_shares_the_targets_packed_layers(tiny_models) -> None:
    from lookupspec.config import ModelConfig
    from lookupspec.text import TextEngine

    te = TextEngine.load(str(tiny_models["tiny-llama"]), ModelConfig(draft_model="self:layers=1"))
    target, draft = te.engine.model, te.engine.draft_model
    assert isinstance(target.lm_head, PackedLinear)
    assert draft.lm_head is target.lm_head  # packed once, not a second copy of the LM head
    assert draft.model.layers[0] is target.model.layers[0]
    assert not any(type(m) is torch.nn.Linear for m in draft.modules())


def test_fused_linears_equal_their_parts_bit_for_bit(backend) -> None:
    torch.manual_seed(0)
    for bias in (True, False):
        parts = [PackedLinear(torch.nn.Linear(576, out, bias=bias)) for out in (576, 192, 192)]
        group = FusedLinears.fuse(parts)
        assert group is not None and (group.in_features, group.out_features) == (576, 960)
        assert (group.bias is not None) == bias
        with torch.inference_mode():
            for rows in (1, 3, 7, 30, 200):
                x = torch.randn(1, rows, 576)
                assert torch.equal(group(x), torch.cat([p(x) for p in parts], dim=-1))
    one = parts[0]
    assert FusedLinears.fuse([one]) is None  # nothing to fuse
    assert FusedLinears.fuse([one, PackedLinear(torch.nn.Linear(32, 8))]) is None  # another input width
    assert FusedLinears.fuse([one, PackedLinear(torch.nn.Linear(576, 8, bias=True))]) is None  # some biased


def test_fusion_is_probed_once_per_backend_library_and_shapes(backend, monkeypatch) -> None:
    """A model's layers share their shapes, so the fusion probe (products of up to 200 rows, both
    ways) runs once a process for each: SmolLM2's 60 fusions probed 2 shape sets instead of 60. A
    verdict either way is kept; other shapes are probed afresh."""
    from lookupspec.runtime import cpu_linear

    monkeypatch.setattr(cpu_linear, "_FUSE_MEMO", {})
    probes = []
    real = FusedLinears.__call__

    def counting(self, x):
        probes.append(x.shape[-2])
        return real(self, x)

    monkeypatch.setattr(FusedLinears, "__call__", counting)

    def fuse(*outs):
        return FusedLinears.fuse([PackedLinear(torch.nn.Linear(64, n)) for n in outs])

    once = len(cpu_linear._PROBE_ROWS)
    assert fuse(48, 16) is not None and len(probes) == once
    assert fuse(48, 16) is not None and len(probes) == once  # other weights, same shapes: no probe
    assert fuse(16, 48) is not None and len(probes) == 2 * once  # another split is probed
    monkeypatch.setattr(FusedLinears, "__call__", lambda self, x: counting(self, x) + 1)  # never equal
    assert fuse(32, 32) is None and len(probes) == 2 * once + 1  # refused at the first row count
    assert fuse(32, 32) is None and len(probes) == 2 * once + 1  # and the refusal is kept
    monkeypatch.setattr(FusedLinears, "__call__", counting)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert fuse(48, 16) is not None and len(probes) == 3 * once + 1  # another thread count
    finally:
        torch.set_num_threads(threads)


def test_engines_on_one_model_share_its_fusions(backend) -> None:
    """A second fusion of the very same parts (a second engine on one model) is the first one, not
    another copy of the weights; once no one holds it, the parts are fused afresh."""
    import gc

    from lookupspec.runtime import cpu_linear

    parts = [PackedLinear(torch.nn.Linear(64, n)) for n in (48, 16)]
    first = FusedLinears.fuse(parts)
    assert first is not None and FusedLinears.fuse(parts) is first
    assert FusedLinears.fuse(list(reversed(parts))) is not first  # other parts, another product
    assert FusedLinears.fuse([PackedLinear(torch.nn.Linear(64, n)) for n in (48, 16)]) is not first
    held = len(cpu_linear._FUSED)
    del first
    gc.collect()
    assert len(cpu_linear._FUSED) == held - 1  # the weights went with their last holder
    again = FusedLinears.fuse(parts)
    assert again is not None and again.parts == tuple(parts)
    x = torch.randn(1, 5, 64)
    assert torch.equal(again(x), torch.cat([p(x) for p in parts], dim=-1))
