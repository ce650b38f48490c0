"""Model loading: sources, determinism of the tiny models, and the stated error messages."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from lookupspec.models import (
    ModelLoadError,
    check_same_tokenizer,
    load_model,
    load_tokenizer,
    render_chat,
    resolve_model_path,
)
from lookupspec.tiny import build_tiny_model


def test_tiny_models_are_deterministic_from_their_seed(tmp_path, tiny_models):
    again = build_tiny_model("tiny-llama", tmp_path / "again", seed=0)
    other = build_tiny_model("tiny-llama", tmp_path / "other", seed=1)
    a = load_file(str(tiny_models["tiny-llama"] / "model.safetensors"))
    b = load_file(str(again / "model.safetensors"))
    c = load_file(str(other / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_every_tiny_architecture_family_loads(tiny_models):
    types = {load_model(str(p)).model.config.model_type for p in tiny_models.values()}
    assert types == {"llama", "qwen2", "mistral", "gemma2", "gemma3_text"}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_dtype_option(tiny_models, dtype):
    lm = load_model(str(tiny_models["tiny-qwen2"]), dtype=dtype)
    assert next(lm.model.parameters()).dtype == getattr(torch, dtype)


def test_dtype_auto_is_float32_on_the_cpu_and_bfloat16_on_cuda(tiny_models):
    from lookupspec.models import resolve_dtype

    lm = load_model(str(tiny_models["tiny-qwen2"]), dtype="auto")
    assert next(lm.model.parameters()).dtype == torch.float32
    assert lm.dtype == "float32"  # the resolved name, what the server reports
    assert resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("auto", "cuda") == resolve_dtype("auto", "cuda:1") == "bfloat16"
    assert resolve_dtype("float16", "cuda") == "float16"


def test_every_model_command_accepts_dtype_auto(monkeypatch):
    import argparse

    from lookupspec.commands.common import add_model_arguments

    monkeypatch.setenv("LOOKUPSPEC_DTYPE", "auto")
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    assert parser.parse_args([]).dtype == "auto"
    assert parser.parse_args(["--dtype", "auto"]).dtype == "auto"
    assert "auto: bfloat16 on CUDA, float32 on the CPU" in " ".join(parser.format_help().split())
    monkeypatch.delenv("LOOKUPSPEC_DTYPE")
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    assert parser.parse_args([]).dtype == "float32"  # the default stays float32


def test_missing_path_error():
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_path("./no/such/model-dir")


def test_hub_id_is_refused_without_network():
    with pytest.raises(ModelLoadError, match="never downloads weights from a model hub"):
        load_model("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_directory_without_config_error(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        resolve_model_path(str(tmp_path))


def test_unsupported_architecture_error(tmp_path, tiny_models):
    d = tmp_path / "resnet"
    shutil.copytree(tiny_models["tiny-llama"], d)
    (d / "config.json").write_text(json.dumps({"model_type": "resnet"}))
    with pytest.raises(ModelLoadError, match="unsupported architecture 'resnet'"):
        load_model(str(d))


def test_non_gguf_file_error(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match=r"not a \.gguf"):
        resolve_model_path(str(f))


def test_bad_dtype_and_device_errors(tiny_models):
    with pytest.raises(ModelLoadError, match="dtype"):
        load_model(str(tiny_models["tiny-llama"]), dtype="int3")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="CUDA is not available"):
            load_model(str(tiny_models["tiny-llama"]), device="cuda")


def test_unpulled_named_model_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOKUPSPEC_HOME", str(tmp_path))
    with pytest.raises(ModelLoadError, match="lookupspec pull smollm2-135m-instruct"):
        resolve_model_path("smollm2-135m-instruct")


def test_draft_with_a_different_tokenizer_is_refused(tiny_models, real_model_dir):
    tiny = load_tokenizer(str(tiny_models["tiny-llama"]))
    real = load_tokenizer(str(real_model_dir))
    check_same_tokenizer(tiny, load_tokenizer(str(tiny_models["tiny-qwen2"])))
    with pytest.raises(ModelLoadError, match="tokenizer differs"):
        check_same_tokenizer(real, tiny)


def test_chat_template_rendering(tiny_models):
    tok = load_tokenizer(str(tiny_models["tiny-llama"]))
    ids = render_chat(tok, [{"role": "user", "content": "hi"}])
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError, match=r"messages\[0\]"):
        render_chat(tok, [{"content": "no role"}])


def test_gguf_parsed_once_shares_readers_and_name_maps_inside_the_block_only(tmp_path):
    """The pull-time speed-up hands out one gguf reader per file and one tensor-name map per
    (architecture, layers) inside its block, and gives gguf its own functions back afterwards, an
    error included."""
    import gguf

    from lookupspec.models import _gguf_parsed_once

    paths = []
    for name in ("a", "b"):
        writer = gguf.GGUFWriter(str(tmp_path / f"{name}.gguf"), "llama")
        writer.add_block_count(2)
        writer.add_string("general.name", name)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        paths.append(tmp_path / f"{name}.gguf")
    real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map
    llama = gguf.MODEL_ARCH.LLAMA
    with pytest.raises(RuntimeError, match="inside"), _gguf_parsed_once():
        a = gguf.GGUFReader(paths[0])
        assert gguf.GGUFReader(str(paths[0])) is a
        b = gguf.GGUFReader(paths[1])
        assert b is not a
        assert bytes(a.fields["general.name"].parts[-1]) == b"a"
        assert bytes(b.fields["general.name"].parts[-1]) == b"b"
        assert gguf.get_tensor_name_map(llama, 2) is gguf.get_tensor_name_map(llama, 2)
        assert gguf.get_tensor_name_map(llama, 3) is not gguf.get_tensor_name_map(llama, 2)
        raise RuntimeError("inside")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (real_reader, real_map)
    assert gguf.GGUFReader(paths[0]) is not gguf.GGUFReader(paths[0])
