"""The runtime's attention: outside a batch it is transformers' sdpa (grouped heads read in place,
bit-identical), so the served model still runs with ``generate`` and its own caches; inside a batch it
is per-sequence attention over the slot pool (tested in test_ragged.py)."""

from __future__ import annotations

import pytest
import torch

from lookupspec import kernels
from lookupspec.hf_compat import with_cache
from lookupspec.runtime import ATTN_NAME, KVCache, use_runtime_attention


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_outside_a_batch_it_is_bit_identical_to_sdpa(tiny_models, name) -> None:
    from lookupspec.models import load_model

    # two loads, not a deepcopy: a copied weight can sit at another alignment, and MKL's one-row
    # matmul then sums in another order (seen here), which would hide what this test looks at
    stock, switched = (load_model(str(tiny_models[name])).model for _ in range(2))
    cfg = stock.config
    assert cfg.num_attention_heads > cfg.num_key_value_heads  # the grouped case is what changes
    assert use_runtime_attention(switched) and switched.config._attn_implementation == ATTN_NAME
    assert stock.config._attn_implementation == "sdpa"
    torch.manual_seed(0)
    prompt = torch.randint(3, cfg.vocab_size, (1, 70))
    caches = [KVCache.for_model(m, capacity=128) for m in (stock, switched)]

    def both(**kw):
        outs = [m(**with_cache(m, c), use_cache=True, logits_to_keep=0, **kw).logits
                for m, c in zip((stock, switched), caches, strict=True)]
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


def test_eager_models_switch_too(tiny_models) -> None:
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(str(tiny_models["tiny-llama"]), attn_implementation="eager")
    assert use_runtime_attention(eager)
    assert eager.config._attn_implementation == ATTN_NAME
    assert not use_runtime_attention(torch.nn.Linear(2, 2))


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
    with torch.inference_mode():  # the switched model still runs transformers' generate
        again = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=24,
                               eos_token_id=2, pad_token_id=0)
    assert again[0, ids.shape[1]:].tolist() == reference


def test_a_tree_mask_goes_to_sdpa_additive_once_per_forward_with_the_same_bits() -> None:
    """SDPA turns a boolean mask into an additive one on every call (every layer); a batch's view
    does it once. The additive mask is what SDPA makes itself, so attention is bit for bit the same."""
    import torch.nn.functional as F

    from lookupspec.runtime import SeqRows
    from lookupspec.runtime.kvpool import LayerSpec, SlotPool
    from lookupspec.runtime.ragged import RaggedBatch

    pool = SlotPool([LayerSpec(2, 16, 16), LayerSpec(2, 16, 16, window=40)], dtype=torch.float32, max_slots=2,
                    max_positions=512, initial_capacity=256, align=8)
    slot = pool.allocate(256)
    pool.ensure(slot, 200)
    pool.advance(slot, 190)
    parents = [-1, 0, 0, 1, 1, 3, 2]
    batch = RaggedBatch(pool, [SeqRows(slot, [5] * len(parents), parents)])
    view = batch.views[0]
    gen = torch.Generator().manual_seed(0)
    for group in range(2):
        boolean = view.masks[group]
        assert isinstance(boolean, torch.Tensor) and boolean.dtype == torch.bool
        additive = view.sdpa_mask(group, torch.float32)
        assert additive is view.sdpa_mask(group, torch.float32)  # made once, reused by every layer
        assert additive.dtype == torch.float32 and additive.shape == boolean.shape
        assert torch.equal(additive == 0, boolean) and bool((additive[~boolean] == float("-inf")).all())
        keys = boolean.shape[-1]
        for _ in range(20):
            q = torch.randn(1, 6, len(parents), 16, generator=gen)
            k, v = (torch.randn(1, 2, keys, 16, generator=gen) for _ in range(2))
            expected = F.scaled_dot_product_attention(q, k, v, attn_mask=boolean, enable_gqa=True)
            got = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, enable_gqa=True)
            assert torch.equal(got, expected)
    plain = RaggedBatch(pool, [SeqRows(slot, [5])]).views[0]
    assert plain.sdpa_mask(0, torch.float32) is None  # a decode row has no mask to convert


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_on_cuda_unmasked_rows_skip_cudnn_and_masked_ones_as_the_probe_found(tiny_models, dtype, monkeypatch):
    """cuDNN's attention builds a graph per new shape (tens of ms at each new key length): decode rows
    run without it, masked views as the probe decided; the flags are restored after the forward."""
    import lookupspec.runtime.attention as attention
    from lookupspec.models import load_model
    from lookupspec.runtime import ModelRunner, SeqRows

    model = load_model(str(tiny_models["tiny-llama"]), dtype=dtype, device="cuda").model
    runner = ModelRunner(model, context_window=256)
    a, b = runner.allocate(40), runner.allocate(40)
    runner.prefill(a, list(range(5, 25)))
    runner.prefill(b, list(range(7, 20)))
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        masked = kwargs.get("attn_mask") is not None or bool(kwargs.get("is_causal", False))
        seen.append((masked, torch.backends.cuda.cudnn_sdp_enabled()))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    runner.forward([SeqRows(a, [3]), SeqRows(b, [4, 5, 6], [-1, 0, 0])])
    assert {m for m, _ in seen} == {True, False}
    # masked views skip cuDNN too where the probe found the runtime agreeing with transformers so
    assert all(enabled == (masked and not runner.unplanned_masks) for masked, enabled in seen), seen
    assert torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_draft_models_forwards_skip_cudnn(tiny_models, monkeypatch):
    """A draft model's cache grows by a position or more at every call: none of its attention runs
    where cuDNN would build a graph for the new length."""
    import lookupspec.runtime.attention as attention
    from lookupspec.drafting.draft_model import DraftModelDrafter
    from lookupspec.models import load_model

    model = load_model(str(tiny_models["tiny-llama"]), dtype="bfloat16", device="cuda").model
    drafter = DraftModelDrafter(model, capacity=128)
    enabled = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        enabled.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    chain = drafter.propose(list(range(5, 30)), 4)
    assert len(chain.tokens) == 4 and enabled and not any(enabled), enabled
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_the_probe_keeps_torchs_backends_for_masked_views_where_the_others_disagree(tiny_models, monkeypatch):
    """The runner's check against transformers runs first with every view on the backends that plan
    nothing per shape; where that check fails, it runs again with torch's choice for masked views,
    which the runner's batches then keep; where both fail, the model is refused."""
    from lookupspec.models import load_model
    from lookupspec.runtime import ModelRunner, RuntimeUnsupported, SeqRows

    model = load_model(str(tiny_models["tiny-llama"])).model
    runner = ModelRunner(model, context_window=256)
    assert runner.unplanned_masks  # on the CPU the two sets are the same: the first check passes
    slot = runner.allocate(20)
    runner.prefill(slot, list(range(5, 15)))
    assert runner.plan([SeqRows(slot, [3, 4], [-1, 0])]).unplanned_masks

    real = ModelRunner._check_against_transformers
    tried = []

    def disagree_when_unplanned(self, *args):
        tried.append(self.unplanned_masks)
        if self.unplanned_masks:
            raise RuntimeUnsupported("disagrees")
        return real(self, *args)

    monkeypatch.setattr(ModelRunner, "_check_against_transformers", disagree_when_unplanned)
    runner = ModelRunner(model, context_window=256)
    assert tried == [True, False] and not runner.unplanned_masks
    slot = runner.allocate(20)
    runner.prefill(slot, list(range(5, 15)))
    assert not runner.plan([SeqRows(slot, [3, 4], [-1, 0])]).unplanned_masks

    def always(self, *args):
        raise RuntimeUnsupported("disagrees")

    monkeypatch.setattr(ModelRunner, "_check_against_transformers", always)
    with pytest.raises(RuntimeUnsupported):
        ModelRunner(model, context_window=256)
