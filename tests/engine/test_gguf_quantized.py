"""A GGUF model served with its quantized weights: a tiny Llama written by the tests per GGUF type,
loaded with ``weights="quantized"`` and with ``weights="float32"``, gives the same greedy tokens with
speculation off and on (drafts accepted and rejected), through the lean forward's stacked products."""

from __future__ import annotations

import pytest
from gguf_tiny import write_tiny_llama
from scripted import ScriptedDrafting

from lookupspec.cost import BudgetPolicy
from lookupspec.engine import Engine
from lookupspec.models import ModelLoadError, load_model
from lookupspec.params import GenerationParams, SpecParams
from lookupspec.runtime import prepare_models
from lookupspec.runtime.cpu_linear import QuantizedLinear
from lookupspec.runtime.native import matmul

pytestmark = pytest.mark.skipif(
    matmul.kernel() is None, reason=f"the streaming kernel does not build here: {matmul.kernel_error()}")

KINDS = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
PROMPT = list(range(40, 90))


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("home")
    mp.setenv("LOOKUPSPEC_HOME", str(path))
    yield path
    mp.undo()


def _tokens(model, spec, drafts=()):
    eng = Engine(model, lookup=ScriptedDrafting(list(drafts), "chain" if drafts else "none", 512),
                 policy=BudgetPolicy(adaptive=False))
    steps = list(eng.generate(PROMPT, GenerationParams(max_tokens=32), spec=spec))
    return [t for s in steps for t in s.tokens], steps


@pytest.mark.parametrize("kind", KINDS)
def test_quantized_weights_give_the_float32_paths_tokens(home, tmp_path, kind):
    path = write_tiny_llama(tmp_path / f"tiny-{kind}.gguf", kind)
    logs: list[str] = []
    quant = load_model(str(path), weights="quantized", log=logs.append)
    floats = load_model(str(path), weights="float32", log=logs.append)
    assert quant.weights == f"quantized ({kind} x 15)"  # 2 layers x 7 linears + the output head
    assert floats.weights == "float"
    assert quant.resident_bytes() < floats.resident_bytes()
    for loaded in (quant, floats):
        prepare_models(loaded.model)
    layers = [m for m in quant.model.modules() if isinstance(m, QuantizedLinear)]
    assert len(layers) == 15 and all(m.kind == kind for m in layers)
    want, _ = _tokens(floats.model, SpecParams(enabled=False))
    assert len(want) == 32
    got, _ = _tokens(quant.model, SpecParams(enabled=False))
    assert got == want
    # drafts that follow the output, then leave it: accepted and rejected nodes in one forward
    drafts = want[:20] + [(t + 1) % 512 for t in want[20:]]
    spec = SpecParams(max_draft_tokens=6)
    got, steps = _tokens(quant.model, spec, drafts)
    assert got == want
    stats = steps[-1].stats
    assert 0 < stats.accepted_tokens < stats.draft_tokens
    assert _tokens(floats.model, spec, drafts)[0] == want


def test_float32_and_non_gguf_models_keep_float_weights(home, tmp_path, tiny_models, monkeypatch):
    path = write_tiny_llama(tmp_path / "tiny.gguf", "Q4_0")
    monkeypatch.setenv("LOOKUPSPEC_WEIGHTS", "float32")
    assert load_model(str(path)).weights == "float"
    monkeypatch.setenv("LOOKUPSPEC_WEIGHTS", "auto")
    assert load_model(str(path)).weights == "quantized (Q4_0 x 15)"
    logs: list[str] = []
    assert load_model(str(tiny_models["tiny-llama"]), weights="quantized", log=logs.append).weights == "float"
    assert any("no GGUF file" in line for line in logs)
    assert load_model(str(path), weights="quantized", dtype="bfloat16", log=logs.append).weights == "float"
    assert any("dequantized at load" in line for line in logs)
    monkeypatch.setenv("LOOKUPSPEC_CPU_LINEAR", "onednn")
    assert load_model(str(path), weights="quantized", log=logs.append).weights == "float"
    with pytest.raises(ModelLoadError, match="weights must be one of"):
        load_model(str(path), weights="int4")
