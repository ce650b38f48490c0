"""The grouped-query sdpa variant gives bit-identical outputs to transformers' own sdpa path, for every
forward shape the engine runs (prefill, one token, causal chains, draft trees), and only switches
models that use sdpa."""

from __future__ import annotations

import pytest
import torch

from lookupspec import kernels
from lookupspec.cpu_attention import ATTN_NAME, use_gqa_sdpa
from lookupspec.kvcache import KVCache


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_gqa_sdpa_is_bit_identical_to_sdpa(tiny_models, name) -> None:
    from lookupspec.models import load_model

    # two loads, not a deepcopy: a copied weight can sit at another alignment, and MKL's one-row
    # matmul then sums in another order (seen here), which would hide what this test looks at
    stock, grouped = (load_model(str(tiny_models[name])).model for _ in range(2))
    cfg = stock.config
    assert cfg.num_attention_heads > cfg.num_key_value_heads  # the grouped case is what changes
    assert use_gqa_sdpa(grouped) and grouped.config._attn_implementation == ATTN_NAME
    assert stock.config._attn_implementation == "sdpa"
    torch.manual_seed(0)
    prompt = torch.randint(3, cfg.vocab_size, (1, 70))
    caches = [KVCache.for_model(m, capacity=128) for m in (stock, grouped)]

    def both(**kw):
        outs = [m(past_key_values=c, use_cache=True, logits_to_keep=0, **kw).logits
                for m, c in zip((stock, grouped), caches, strict=True)]
        assert torch.equal(outs[0], outs[1])

    with torch.inference_mode():
        both(input_ids=prompt)  # prefill: causal, no mask
        length = prompt.shape[1]
        for n in (1, 2, 5, 12):
            x = torch.randint(3, cfg.vocab_size, (1, n))
            both(input_ids=x)  # a causal chain
            for c in caches:
                c.truncate(length)
            parents = torch.tensor([-1] + [max(i - 2, -1) for i in range(n - 1)])  # branching tree
            mask, positions = kernels.tree_mask(parents, length, torch.float32)
            both(input_ids=x, attention_mask=mask, position_ids=positions)
            for c in caches:
                c.truncate(length)


def test_only_sdpa_models_are_switched(tiny_models) -> None:
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(str(tiny_models["tiny-llama"]), attn_implementation="eager")
    assert not use_gqa_sdpa(eager)
    assert eager.config._attn_implementation == "eager"
    assert not use_gqa_sdpa(torch.nn.Linear(2, 2))


def test_engine_switches_its_model_and_decodes_as_before(tiny_models) -> None:
    from lookupspec.engine import Engine
    from lookupspec.models import load_model
    from lookupspec.params import GenerationParams, SpecParams

    model = load_model(str(tiny_models["tiny-llama"])).model
    ids = torch.arange(3, 40)[None, :]
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24,
                             eos_token_id=2, pad_token_id=0)
    reference = out[0, ids.shape[1]:].tolist()
    engine = Engine(model)
    assert model.config._attn_implementation == ATTN_NAME
    params = GenerationParams(max_tokens=24, eos_token_ids=(2,))
    prompt = ids[0].tolist()
    for spec in (SpecParams(enabled=False), SpecParams()):
        assert [t for s in engine.generate(prompt, params, spec=spec) for t in s.tokens] == reference
