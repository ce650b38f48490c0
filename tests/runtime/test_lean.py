"""The lean forward gives bit-identical logits and KV entries to the runner's transformers path for
every shape the engine runs (one token, causal chains, draft trees, several sequences at once), on
the tiny families with and without oneDNN-packed layers and on SmolLM2; it declines models it does
not cover."""

from __future__ import annotations

import pytest
import torch

from lookupspec.runtime import LeanForward, ModelRunner, SeqRows, layer_specs


def _compare(model, prompts: list[list[int]], sizes=(1, 2, 3, 5, 12, 24)) -> None:
    """Prefill every prompt into a lean runner and a transformers-path runner, then run each step
    shape (for all sequences at once) through both and require equal logits and KV entries."""
    lean = ModelRunner(model, context_window=4096)
    plain = ModelRunner(model, context_window=4096, lean=False)
    assert lean.lean is not None and plain.lean is None
    gen = torch.Generator().manual_seed(1)
    slots = {}
    for r in (lean, plain):
        slots[id(r)] = [r.allocate(len(p) + 64) for p in prompts]
        for s, p in zip(slots[id(r)], prompts, strict=True):
            r.prefill(s, p)
    vocab = model.config.vocab_size
    for n in sizes:
        tokens = [torch.randint(3, vocab, (n,), generator=gen).tolist() for _ in prompts]
        parents = [-1] + [max(i - 2, -1) for i in range(n - 1)]  # a branching tree
        for structure in (None, parents):
            logits = []
            for r in (lean, plain):
                rows = [SeqRows(s, t, structure) for s, t in zip(slots[id(r)], tokens, strict=True)]
                logits.append(r.forward(rows))
            assert torch.equal(logits[0], logits[1]), f"n={n}: {(logits[0] - logits[1]).abs().max():.3g}"
            for layer in range(len(lean.layers)):
                for a, b in zip(slots[id(lean)], slots[id(plain)], strict=True):
                    end = lean.length(a)
                    for part in ("keys", "values"):
                        got, want = getattr(lean.pool, part)(layer), getattr(plain.pool, part)(layer)
                        assert torch.equal(got[a, :, :end], want[b, :, :end])
            for r in (lean, plain):
                for s, p in zip(slots[id(r)], prompts, strict=True):
                    r.pool.truncate(s, len(p))


@pytest.mark.parametrize("packed", [False, True], ids=["nn-linear", "onednn-packed"])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-mistral"])
def test_lean_forward_is_bit_identical(tiny_models, name, packed) -> None:
    from lookupspec.models import load_model
    from lookupspec.runtime import FusedLinears, pack_linears, packing_available

    if packed and not packing_available():
        pytest.skip("this torch build has no oneDNN linear ops")
    model = load_model(str(tiny_models[name])).model
    if packed:
        assert pack_linears(model) > 0
        lean = LeanForward.for_model(model, [s.window for s in layer_specs(model)])
        assert lean is not None  # the fused q/k/v and gate/up matmuls are called whole
        assert all(isinstance(layer.qkv, FusedLinears) and isinstance(layer.gate_up, FusedLinears)
                   for layer in lean.layers)
        if name == "tiny-qwen2":  # q/k/v with biases
            assert lean.layers[0].qkv.bias is not None
    torch.manual_seed(0)
    vocab = model.config.vocab_size
    _compare(model, [torch.randint(3, vocab, (n,)).tolist() for n in (70, 9, 33)])


@pytest.mark.parametrize("setting", ["auto", "no-sum-order", "torch"])
def test_the_native_element_wise_steps_give_the_torch_ops_bits(tiny_models, monkeypatch, setting) -> None:
    """With layer_ops.c (the default where it builds) the rotary embedding, the pool writes, and each
    residual sum with the RMSNorm after it run natively in every layer, and the logits and KV entries
    are still transformers' bits. Where layer_ops.c cannot sum squares in torch's order ("no-sum-order")
    the mean of squares stays torch's and only the scaling is native; with
    LOOKUPSPEC_LEAN_NATIVE=torch the torch ops run. The same bits every time."""
    from lookupspec.models import load_model
    from lookupspec.runtime.native import layer_ops

    monkeypatch.setenv("LOOKUPSPEC_LEAN_NATIVE", "torch" if setting == "torch" else "auto")
    if setting != "torch" and layer_ops.kernel() is None:
        pytest.skip("layer_ops.c does not build here")
    if setting == "no-sum-order":
        monkeypatch.setattr(layer_ops, "sum_lanes", lambda lib, dim: None)
    calls = {"rope_store": 0, "rms_norm": 0, "add_rms_norm": 0}
    for name in calls:
        real = getattr(layer_ops, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(layer_ops, name, counted)
    for family in ("tiny-llama", "tiny-mistral"):  # full attention; sliding windows
        model = load_model(str(tiny_models[family])).model
        assert model.config.num_hidden_layers == 2
        torch.manual_seed(0)
        vocab = model.config.vocab_size
        _compare(model, [torch.randint(3, vocab, (n,)).tolist() for n in (40, 9)], sizes=(1, 3, 12))
    forwards = calls["rope_store"] // 2  # a rotary call a layer
    layers_norms = 2 * calls["rope_store"] + forwards  # two norms a layer, and the last one
    assert calls["rope_store"] > 0 or setting == "torch"
    if setting == "torch":
        assert calls == {"rope_store": 0, "rms_norm": 0, "add_rms_norm": 0}
    elif setting == "auto":
        assert calls["rms_norm"] == 0 and calls["add_rms_norm"] == layers_norms
    else:
        assert calls["add_rms_norm"] == 0 and calls["rms_norm"] == layers_norms


def test_the_sum_of_squares_follows_torchs_order() -> None:
    """layer_ops.c's residual-and-norm pass matches torch's ops for every row count and the hidden sizes
    of common models, with the vector width found by comparing with torch."""
    from lookupspec.runtime.native import layer_ops

    lib = layer_ops.kernel()
    if lib is None:
        pytest.skip("layer_ops.c does not build here")
    from lookupspec.runtime.lean import _rms_norm

    gen = torch.Generator().manual_seed(3)
    for dim in (64, 576, 960, 2048, 4096, 5000):
        lanes = layer_ops.sum_lanes(lib, dim)
        assert lanes in (8, 16)
        weight = torch.randn(dim, generator=gen)
        for rows in (1, 3, 40, 129):
            scale = 10 ** torch.empty(1, rows, 1).uniform_(-4, 4, generator=gen)  # eight decades
            h = torch.randn(1, rows, dim, generator=gen) * scale
            y = torch.randn(1, rows, dim, generator=gen)
            want_h = h + y
            want = _rms_norm(want_h, weight, 1e-5)
            got = layer_ops.add_rms_norm(lib, h, y, weight, 1e-5, lanes)
            assert torch.equal(h, want_h) and torch.equal(got, want), (dim, rows)
            assert torch.equal(layer_ops.add_rms_norm(lib, want_h.clone(), None, weight, 1e-5, lanes), want)


def test_lean_forward_declines_what_it_does_not_cover(tiny_models) -> None:
    from transformers import AutoModelForCausalLM

    path = str(tiny_models["tiny-llama"])
    bf16 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    assert LeanForward.for_model(bf16, [None, None]) is None
    assert LeanForward.for_model(torch.nn.Linear(2, 2), []) is None
    gemma = AutoModelForCausalLM.from_pretrained(str(tiny_models["tiny-gemma3"]))
    assert LeanForward.for_model(gemma, [s.window for s in layer_specs(gemma)]) is None
    model = AutoModelForCausalLM.from_pretrained(path)
    assert LeanForward.for_model(model, [None]) is None  # windows for the wrong number of layers
    assert LeanForward.for_model(model, [None, None]) is not None


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
    assert engine.lean is not None  # the served model (packed) takes the lean path
    text = "Summarize: the quick brown fox jumps over the lazy dog. " * 20
    prompt = real_text_engine.encode_prompt(messages=[{"role": "user", "content": text}])
    _compare(engine.model, [prompt, prompt[:57]], sizes=(1, 4, 16))


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


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral"])
def test_the_served_forward_gives_the_same_bits_at_every_thread_count(tiny_models, name) -> None:
    """The forward the engine serves (packed layers, the lean path, its native steps) splits work by
    torch's thread count; every row's bits must not depend on it. `make test` runs its workers with
    one thread each (tests/suite_plan.py), so this test sets the counts itself."""
    from lookupspec.models import load_model
    from lookupspec.runtime import prepare_models

    model = load_model(str(tiny_models[name])).model
    prepare_models(model)
    torch.manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(3, vocab, (n,)).tolist() for n in (70, 9, 33)]
    steps = [[torch.randint(3, vocab, (n,)).tolist() for _ in prompts] for n in (1, 5, 12)]
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            runner = ModelRunner(model, context_window=4096)
            assert runner.lean is not None
            slots = [runner.allocate(len(p) + 64) for p in prompts]
            out = [runner.prefill(s, p) for s, p in zip(slots, prompts, strict=True)]
            for tokens in steps:
                parents = [-1] + [max(i - 2, -1) for i in range(len(tokens[0]) - 1)]
                rows = [SeqRows(s, t, parents) for s, t in zip(slots, tokens, strict=True)]
                out.append(runner.forward(rows))
            results.append(out)
    finally:
        torch.set_num_threads(before)
    for threads, out in zip((2, 3), results[1:], strict=True):
        for i, (got, want) in enumerate(zip(out, results[0], strict=True)):
            assert torch.equal(got, want), f"{threads} threads, forward {i}: {(got - want).abs().max():.3g}"
