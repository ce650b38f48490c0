"""`lookupspec random-model`: a model of another's exact shape and tokenizer with seeded random weights,
which every lookupspec command loads; bad sources and outputs are clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lookupspec.cli import main
from lookupspec.random_model import TOKENIZER_FILES

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


def test_the_copy_has_the_source_shape_and_tokenizer_and_weights_drawn_from_the_seed(tiny_models, tmp_path):
    source = Path(tiny_models["tiny-llama"])
    out = tmp_path / "rand"
    assert main(["random-model", str(source), str(out), "--seed", "3", "--initializer-range", "0.25"]) == 0

    src_cfg = json.loads((source / "config.json").read_text())
    cfg = json.loads((out / "config.json").read_text())
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "max_position_embeddings", "rope_theta"):
        assert cfg.get(key) == src_cfg.get(key), key
    assert cfg["initializer_range"] == 0.25
    for name in TOKENIZER_FILES:
        assert (out / name).is_file() == (source / name).is_file(), name
        if (source / name).is_file():
            assert (out / name).read_bytes() == (source / name).read_bytes(), name
    note = json.loads((out / "lookupspec.json").read_text())
    assert note["random_weights"] is True and note["seed"] == 3 and note["shape_of"] == str(source)

    src_w, w = _weights(source), _weights(out)
    assert {k: v.shape for k, v in w.items()} == {k: v.shape for k, v in src_w.items()}
    proj = next(k for k in w if k.endswith("q_proj.weight"))
    assert not torch.equal(w[proj], src_w[proj])
    assert 0.2 < float(w[proj].float().std()) < 0.3  # drawn with the range asked for

    again, other = tmp_path / "again", tmp_path / "other"
    assert main(["random-model", str(source), str(again), "--seed", "3", "--initializer-range", "0.25"]) == 0
    assert main(["random-model", str(source), str(other), "--seed", "4", "--initializer-range", "0.25"]) == 0
    w2, w3 = _weights(again), _weights(other)
    assert all(torch.equal(w[k], w2[k]) for k in w)
    assert not torch.equal(w[proj], w3[proj])


def test_the_copy_loads_and_generates_in_its_dtype(tiny_models, tmp_path, capsys):
    out = tmp_path / "rand16"
    assert main(["random-model", str(tiny_models["tiny-qwen2"]), str(out), "--dtype", "bfloat16"]) == 0
    assert all(t.dtype == torch.bfloat16 for t in _weights(out).values())
    capsys.readouterr()
    assert main(["generate", "--model", str(out), "--dtype", "bfloat16", "--max-tokens", "6", "hello"]) == 0
    assert capsys.readouterr().out.strip()  # some text came out


def test_a_bare_config_takes_its_tokenizer_from_elsewhere_or_goes_without(tmp_path):
    config = FIXTURES / "models" / "tiny-llama" / "config.json"
    with_tok, without = tmp_path / "with", tmp_path / "without"
    assert main(["random-model", str(config), str(with_tok), "--tokenizer", str(FIXTURES / "tokenizer")]) == 0
    tokenizer_json = (FIXTURES / "tokenizer" / "tokenizer.json").read_bytes()
    assert (with_tok / "tokenizer.json").read_bytes() == tokenizer_json
    assert main(["random-model", str(config), str(without)]) == 0
    # (save_pretrained writes a generation_config.json of its own)
    assert not any((without / name).exists() for name in TOKENIZER_FILES if name != "generation_config.json")
    assert json.loads((without / "lookupspec.json").read_text())["tokenizer_from"] is None


def test_bad_sources_and_outputs_are_clear_errors(tiny_models, tmp_path, capsys):
    source = str(tiny_models["tiny-llama"])
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")

    def error(*args: str) -> str:
        capsys.readouterr()
        assert main(["random-model", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "Traceback" not in err
        return err

    assert f"{busy} exists and is not an empty directory (pass --force" in error(source, str(busy))
    assert (busy / "keep.txt").read_text() == "mine"  # untouched
    assert "does not exist" in error(str(tmp_path / "nope"), str(tmp_path / "a"))
    assert "never downloads weights" in error("HuggingFaceTB/SmolLM2-135M", str(tmp_path / "b"))
    assert "has no tokenizer files" in error(source, str(tmp_path / "c"), "--tokenizer", str(busy))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
    with pytest.raises(SystemExit) as exit_:
        main(["random-model", source, str(tmp_path / "d"), "--initializer-range", "0"])
    assert exit_.value.code == 2 and "must be > 0" in capsys.readouterr().err

    assert main(["random-model", source, str(busy), "--force"]) == 0  # replaced whole
    assert (busy / "model.safetensors").is_file() and not (busy / "keep.txt").exists()
