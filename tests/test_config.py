"""The model's and the engine's configuration objects: validated on construction, frozen, and what the
CLI's flags map onto."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from lookupspec.commands.common import add_model_arguments, engine_config, model_config
from lookupspec.config import EngineConfig, ModelConfig


@pytest.mark.parametrize(("bad", "says"), [
    ({"max_batch": 0}, "max_batch"), ({"context_window": 1}, "context_window"),
    ({"kv_cache_bytes": 0}, "kv_cache_bytes"), ({"prefill_chunk": 0}, "prefill_chunk"),
    ({"prefix_cache_bytes": -1}, "prefix_cache_bytes"),
    ({"prefix_cache_bytes": 1 << 20}, "needs prefill_chunk"),  # the prefix cache keeps chunks' blocks
    ({"prefill_chunk": 8, "prefix_block_size": 9}, "prefix_block_size"),
    ({"prefill_chunk": 8, "prefix_block_size": 0}, "prefix_block_size"),
    ({"cuda_graphs": "yes"}, "cuda_graphs"),
])
def test_an_engine_config_out_of_range_is_refused(bad, says) -> None:
    with pytest.raises(ValueError, match=says):
        EngineConfig(**bad)


def test_a_model_config_with_an_unknown_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="dtype"):
        ModelConfig(dtype="int3")
    with pytest.raises(ValueError, match="draft_model"):
        ModelConfig(draft_model="")
    with pytest.raises(ValueError, match="weights"):
        ModelConfig(weights="int4")


def test_configs_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        EngineConfig().max_batch = 2  # type: ignore[misc]


def test_the_model_flags_map_onto_the_configs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOKUPSPEC_PACKED_LINEAR", raising=False)
    monkeypatch.setenv("LOOKUPSPEC_WEIGHTS", "float32")
    monkeypatch.setenv("LOOKUPSPEC_LEAN_FORWARD", "0")
    monkeypatch.delenv("LOOKUPSPEC_CUDA_GRAPHS", raising=False)
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    parser.add_argument("--draft-model", default=None)
    args = parser.parse_args(["--dtype", "bfloat16", "--no-packed-linear", "--draft-model", "self:layers=2"])
    assert model_config(args) == ModelConfig(draft_model="self:layers=2", dtype="bfloat16", auto_pull=True,
                                             packed_linear=False, weights="float32")
    assert engine_config(args, max_batch=4, prefill_chunk=32) == EngineConfig(lean=False, max_batch=4,
                                                                               prefill_chunk=32)


def test_cuda_graphs_default_to_auto_and_come_from_the_flag_or_the_environment(monkeypatch) -> None:
    monkeypatch.delenv("LOOKUPSPEC_CUDA_GRAPHS", raising=False)
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    assert EngineConfig().cuda_graphs == "auto" == engine_config(parser.parse_args([])).cuda_graphs
    assert engine_config(parser.parse_args(["--cuda-graphs", "off"])).cuda_graphs == "off"
    monkeypatch.setenv("LOOKUPSPEC_CUDA_GRAPHS", "on")
    parser = argparse.ArgumentParser()
    add_model_arguments(parser)
    assert engine_config(parser.parse_args([])).cuda_graphs == "on"
    with pytest.raises(SystemExit):
        parser.parse_args(["--cuda-graphs", "maybe"])
