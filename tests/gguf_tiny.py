"""A tiny Llama written as a GGUF file by the tests (the ``gguf`` package's writer): the fixture
tokenizer's byte-level BPE, random weights with the linear layers quantized to one GGUF type."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, VOCAB = 256, 512, 2, 4, 2, 512


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator,
                  scale: float = 0.02) -> np.ndarray:
    """Random ``kind`` blocks [rows, row_bytes]: random integer fields, float16 scales near
    ``scale`` (some negative, some subnormal) so the weights are finite and model-sized."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    per_block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    nb = cols // per_block
    raw = rng.integers(0, 256, (rows, nb, nbytes), dtype=np.uint8)
    spread = scale / {"Q8_0": 64, "Q4_0": 8, "Q4_1": 8, "Q5_0": 16, "Q5_1": 16, "Q4_K": 256,
                      "Q5_K": 512, "Q6_K": 1024}[kind]
    scales = (rng.standard_normal((rows, nb, 2)) * spread).astype(np.float16)
    scales[0, 0, 0] = np.float16(3e-7)  # a subnormal float16
    at = (208,) if kind == "Q6_K" else (0, 2) if kind in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else (0,)
    for i, offset in enumerate(at):
        raw[..., offset:offset + 2] = scales[..., i:i + 1].view(np.uint8)
    return raw.reshape(rows, nb * nbytes)


def write_tiny_llama(path: Path, kind: str, seed: int = 0) -> Path:
    """A 2-layer Llama (hidden 256, so every GGUF block size fits) with its linear layers (and the
    output head) quantized to ``kind``; embeddings and norms float32."""
    import gguf

    rng = np.random.default_rng(seed)
    tok = json.loads((ROOT / "fixtures" / "tokenizer" / "tokenizer.json").read_text())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    for added in tok["added_tokens"]:
        tokens[added["id"]] = added["content"]
    types = [gguf.TokenType.CONTROL if t.startswith("<|") else gguf.TokenType.NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(2048)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(VOCAB)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    qtype = gguf.GGMLQuantizationType[kind]

    def quant(name: str, rows: int, cols: int) -> None:
        w.add_tensor(name, random_blocks(kind, rows, cols, rng), raw_dtype=qtype)

    def dense(name: str, *shape: int, scale: float = 0.5, offset: float = 0.0) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale + offset).astype(np.float32))

    dense("token_embd.weight", VOCAB, HIDDEN)
    for i in range(LAYERS):
        dense(f"blk.{i}.attn_norm.weight", HIDDEN, scale=0.1, offset=1.0)
        quant(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN)
        quant(f"blk.{i}.attn_k.weight", HIDDEN // HEADS * KV_HEADS, HIDDEN)
        quant(f"blk.{i}.attn_v.weight", HIDDEN // HEADS * KV_HEADS, HIDDEN)
        quant(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        dense(f"blk.{i}.ffn_norm.weight", HIDDEN, scale=0.1, offset=1.0)
        quant(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        quant(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        quant(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    dense("output_norm.weight", HIDDEN, scale=0.1, offset=1.0)
    quant("output.weight", VOCAB, HIDDEN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
