"""The lean forward gives bit-identical logits and KV entries to the model's own forward for every
shape the engine runs over a filled cache (one token, causal chains, draft trees), on both tiny
families with and without oneDNN-packed layers and on SmolLM2; it declines models it does not cover."""

from __future__ import annotations

import pytest
import torch

from lookupspec import kernels
from lookupspec.kvcache import KVCache
from lookupspec.lean_forward import LeanForward


def _compare(model, lean: LeanForward, prompt: torch.Tensor, sizes=(1, 2, 3, 5, 12, 24)) -> None:
    """Prefill two caches with the model, then run each step shape through the model and the lean
    forward side by side and require equal logits and equal cache contents."""
    cfg = model.config
    caches = [KVCache.for_model(model, capacity=prompt.shape[1] + 64) for _ in range(2)]
    length = prompt.shape[1]
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for c in caches:
            model(input_ids=prompt, past_key_values=c, use_cache=True)

        def both(x, mask=None, positions=None):
            ref = model(input_ids=x, past_key_values=caches[0], use_cache=True, logits_to_keep=0,
                        attention_mask=mask, position_ids=positions).logits[0]
            got = lean(x, caches[1], attention_mask=mask, position_ids=positions)
            assert got.shape == ref.shape
            assert torch.equal(got, ref), f"n={x.shape[1]}: max diff {(got - ref).abs().max().item():.3g}"
            for a, b in zip(caches[0].buffered, caches[1].buffered, strict=True):
                assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
            for c in caches:
                c.truncate(length)

        for n in sizes:
            x = torch.randint(3, cfg.vocab_size, (1, n), generator=gen)
            both(x)  # one token or a causal chain: no mask from the engine
            parents = torch.tensor([-1] + [max(i - 2, -1) for i in range(n - 1)])  # branching tree
            mask, positions = kernels.tree_mask(parents, length, torch.float32)
            both(x, mask, positions)


@pytest.mark.parametrize("packed", [False, True], ids=["nn-linear", "onednn-packed"])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_lean_forward_is_bit_identical(tiny_models, name, packed) -> None:
    from lookupspec.cpu_attention import use_gqa_sdpa
    from lookupspec.cpu_linear import pack_linears, packing_available
    from lookupspec.models import load_model

    if packed and not packing_available():
        pytest.skip("this torch build has no oneDNN linear ops")
    model = load_model(str(tiny_models[name])).model
    if packed:
        assert pack_linears(model) > 0
    use_gqa_sdpa(model)  # as the engine runs it
    lean = LeanForward.for_model(model)
    assert lean is not None
    if packed:  # the fused q/k/v and gate/up matmuls are called whole
        from lookupspec.cpu_linear import FusedLinears

        assert all(isinstance(layer.qkv, FusedLinears) and isinstance(layer.gate_up, FusedLinears)
                   for layer in lean.layers)
        if name == "tiny-qwen2":  # q/k/v with biases
            assert lean.layers[0].qkv.bias is not None
    torch.manual_seed(0)
    _compare(model, lean, torch.randint(3, model.config.vocab_size, (1, 70)))


def test_lean_forward_declines_what_it_does_not_cover(tiny_models) -> None:
    from transformers import AutoModelForCausalLM

    path = str(tiny_models["tiny-llama"])
    eager = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    assert LeanForward.for_model(eager) is None
    bf16 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    assert LeanForward.for_model(bf16) is None
    assert LeanForward.for_model(torch.nn.Linear(2, 2)) is None
    model = AutoModelForCausalLM.from_pretrained(path)
    lean = LeanForward.for_model(model)
    assert lean is not None
    with pytest.raises(ValueError, match="filled cache"):
        lean(torch.tensor([[5]]), KVCache.for_model(model))
    with pytest.raises(ValueError, match="one sequence"):
        lean(torch.tensor([[5], [6]]), KVCache.for_model(model))


def test_engine_uses_it_only_when_asked(tiny_models) -> None:
    from lookupspec.engine import Engine
    from lookupspec.models import load_model
    from lookupspec.params import GenerationParams, SpecParams

    model = load_model(str(tiny_models["tiny-qwen2"])).model
    on, off = Engine(model), Engine(model, lean=False)
    assert isinstance(on.lean, LeanForward) and off.lean is None
    params = GenerationParams(max_tokens=32, eos_token_ids=(2,))
    prompt = list(range(3, 60)) + list(range(3, 30))
    for spec in (SpecParams(enabled=False), SpecParams()):
        outs = [[t for s in e.generate(prompt, params, spec=spec) for t in s.tokens] for e in (on, off)]
        assert outs[0] == outs[1] and len(outs[0]) == 32


@pytest.mark.real_model
def test_lean_forward_is_bit_identical_on_smollm2(real_text_engine) -> None:
    engine = real_text_engine.engine
    assert engine.lean is not None  # the served model (packed, grouped-query sdpa) takes the lean path
    text = "Summarize: the quick brown fox jumps over the lazy dog. " * 20
    prompt = real_text_engine.encode_prompt(messages=[{"role": "user", "content": text}])
    _compare(engine.model, engine.lean, torch.tensor([prompt]), sizes=(1, 4, 16))


def test_bench_systems_with_and_without_the_lean_forward(tiny_models) -> None:
    from lookupspec.benchmarks.systems import LookupspecSystem
    from lookupspec.models import load_model

    target = load_model(str(tiny_models["tiny-llama"]))
    systems = {name: LookupspecSystem(target, None, (2,), name)
               for name in ("lookupspec", "lookupspec-hf-forward", "lookupspec-plain")}
    lean = {name: s.engine.lean is not None for name, s in systems.items()}
    spec = {name: s.spec.enabled for name, s in systems.items()}
    assert lean == {"lookupspec": True, "lookupspec-hf-forward": False, "lookupspec-plain": True}
    assert spec == {"lookupspec": True, "lookupspec-hf-forward": True, "lookupspec-plain": False}
    prompt = list(range(3, 60)) + list(range(3, 30))
    runs = [s.generate(prompt, 24).tokens for s in systems.values()]
    assert runs[0] == runs[1] == runs[2]
