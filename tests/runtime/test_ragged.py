"""Ragged forwards: each sequence's rows among other sequences give exactly the logits and KV entries
of that sequence's batch-of-one forward (every family, sliding windows included), and the runtime's
sliding-window attention matches transformers' own masks on rows past the window."""

from __future__ import annotations

import pytest
import torch

from lookupspec.runtime import ModelRunner, SeqRows, pack_linears, packing_available
from lookupspec.tiny import TINY_MODELS

PROMPTS = (5, 30, 70, 9)  # lengths; the sliding-window fixtures have a window of 12


def _rows(slots, vocab, gen):
    tok = lambda n: torch.randint(3, vocab, (n,), generator=gen).tolist()  # noqa: E731
    return [SeqRows(slots[0], tok(1)),  # plain decoding
            SeqRows(slots[1], tok(4)),  # a chain
            SeqRows(slots[2], tok(7), [-1, 0, 0, 1, 3, 1, -1]),  # a tree, two nodes off the cache
            SeqRows(slots[3], tok(2), [-1, -1])]


def _run(runner, seqs):
    """Logits of each sequence's rows and its new KV entries, then the slots rolled back."""
    logits = runner.forward(seqs)
    out, row = [], 0
    for s in seqs:
        n = len(s.tokens)
        end = runner.length(s.slot)
        kv = []
        for i in range(len(runner.layers)):
            lo, hi = runner.pool.entry(s.slot, i, end - n), runner.pool.entry(s.slot, i, end)
            kv.append(runner.pool.keys(i)[s.slot, :, lo:hi].clone())
        out.append((logits[row:row + n].clone(), kv))
        row += n
        runner.pool.truncate(s.slot, end - n)
    return out


@pytest.mark.parametrize("name", TINY_MODELS)
def test_batched_forward_is_bit_identical_to_each_batch_of_one(tiny_models, name) -> None:
    from lookupspec.models import load_model

    if not packing_available():
        pytest.skip("this torch build has no oneDNN linear ops")
    model = load_model(str(tiny_models[name])).model
    pack_linears(model)
    runner = ModelRunner(model, context_window=2048)
    assert runner.batch_invariant
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    slots = [runner.allocate(n + 16) for n in PROMPTS]
    for s, n in zip(slots, PROMPTS, strict=True):
        runner.prefill(s, torch.randint(3, vocab, (n,), generator=gen).tolist())
    seqs = _rows(slots, vocab, gen)
    alone = [_run(runner, [s])[0] for s in seqs]
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0], [1, 3]):
        together = _run(runner, [seqs[i] for i in order])
        for i, (logits, kv) in zip(order, together, strict=True):
            assert torch.equal(logits, alone[i][0]), f"sequence {i} in batch {order}"
            assert all(torch.equal(a, b) for a, b in zip(kv, alone[i][1], strict=True))


def test_unpacked_float32_layers_are_reported_as_not_batch_invariant_but_agree_closely(tiny_models) -> None:
    """MKL's plain float32 product depends on the row count: the probe says so, and the difference a
    batch makes is float noise (what the benchmarks count as near-ties)."""
    from lookupspec.models import load_model

    model = load_model(str(tiny_models["tiny-llama"])).model
    runner = ModelRunner(model, context_window=2048)
    gen = torch.Generator().manual_seed(0)
    slots = [runner.allocate(n + 16) for n in PROMPTS]
    for s, n in zip(slots, PROMPTS, strict=True):
        runner.prefill(s, torch.randint(3, 512, (n,), generator=gen).tolist())
    seqs = _rows(slots, 512, gen)
    alone = [_run(runner, [s])[0][0] for s in seqs]
    together = [lg for lg, _ in _run(runner, seqs)]
    same = all(torch.equal(a, b) for a, b in zip(alone, together, strict=True))
    assert runner.batch_invariant in (False, True)
    if runner.batch_invariant:
        assert same
    for a, b in zip(alone, together, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["tiny-gemma2", "tiny-gemma3", "tiny-mistral"])
def test_sliding_window_rows_match_transformers_past_the_window(tiny_models, name) -> None:
    """A draft tree at positions 40.. (window 12): each row's logits equal transformers' forward of the
    prompt plus that row's path, with transformers' own sliding-window masks."""
    from lookupspec.models import load_model

    model = load_model(str(tiny_models[name])).model
    runner = ModelRunner(model, context_window=2048)
    assert {s.window for s in runner.layers} >= {12}
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, 512, (40,), generator=gen).tolist()
    tokens = torch.randint(3, 512, (8,), generator=gen).tolist()
    parents = [-1, 0, 1, 1, 3, 4, 5, -1]
    slot = runner.allocate(64)
    for start in range(0, 40, 16):  # chunked prefill past the window
        runner.prefill(slot, prompt[start:start + 16])
    got = runner.forward([SeqRows(slot, tokens, parents)])
    for i in range(len(tokens)):
        path, j = [], i
        while j >= 0:
            path.append(tokens[j])
            j = parents[j]
        with torch.inference_mode():
            ref = model(input_ids=torch.tensor([prompt + path[::-1]])).logits[0, -1]
        torch.testing.assert_close(got[i], ref, rtol=1e-4, atol=1e-4)


def test_other_architectures_are_served_or_refused_clearly() -> None:
    """GPT-2 (Conv1D projections, learned absolute positions) runs on the runtime's attention and
    passes the self-check; a state-space model, which keeps no KV cache, is refused by name."""
    from transformers import AutoModelForCausalLM, GPT2Config, MambaConfig

    from lookupspec.runtime import RuntimeUnsupported

    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=512, n_embd=32, n_layer=2, n_head=2,
                                                       bos_token_id=0, eos_token_id=0)).eval()
    runner = ModelRunner(gpt2, context_window=128)
    assert runner.batch_invariant is not None
    mamba = AutoModelForCausalLM.from_config(MambaConfig(vocab_size=512, hidden_size=32, num_hidden_layers=2,
                                                         state_size=4)).eval()
    with pytest.raises(RuntimeUnsupported, match="mamba models keep no attention"):
        ModelRunner(mamba, context_window=128)
