"""`lookupspec serve` configuration: every flag has an environment variable; bad values are clear
errors before anything is loaded."""

from __future__ import annotations

import argparse

import pytest
from lookupspec.gateway.config import GatewayConfig, parse_api_keys

from lookupspec.commands import serve


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    return parser.parse_args(list(argv))


def test_every_setting_comes_from_the_environment_too(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    env = {"LOOKUPSPEC_MODEL": "/models/m", "LOOKUPSPEC_DRAFT_MODEL": "/models/d",
           "LOOKUPSPEC_HOST": "0.0.0.0", "LOOKUPSPEC_PORT": "9001", "LOOKUPSPEC_DATA_DIR": str(tmp_path),
           "LOOKUPSPEC_REDIS_URL": "redis://r:1/0", "LOOKUPSPEC_API_KEYS": "k1:alpha, k2:beta",
           "LOOKUPSPEC_MAX_QUEUE": "3", "LOOKUPSPEC_REQUEST_TIMEOUT": "12.5", "LOOKUPSPEC_DRAIN_TIMEOUT": "4",
           "LOOKUPSPEC_MAX_MODEL_LEN": "512", "LOOKUPSPEC_ADMIN_KEY": "sk-admin",
           "LOOKUPSPEC_REDIS_OUTPUT_BUFFER_LIMIT": "77", "LOOKUPSPEC_PREFILL_STRETCH": "3.5",
           "LOOKUPSPEC_TRACE_ITERATIONS": str(tmp_path / "trace.jsonl")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = parse()
    assert (args.model, args.draft_model, args.host, args.port) == ("/models/m", "/models/d", "0.0.0.0", 9001)
    assert (args.data_dir, args.redis_url, args.max_queue) == (tmp_path, "redis://r:1/0", 3)
    assert (args.request_timeout, args.drain_timeout, args.max_model_len) == (12.5, 4.0, 512)
    assert (args.admin_key, args.redis_output_buffer_limit, args.prefill_stretch) == ("sk-admin", 77, 3.5)
    assert args.api_keys is None and args.env_api_keys == ["k1:alpha", "k2:beta"]
    assert args.trace_iterations == str(tmp_path / "trace.jsonl")
    # flags win over the environment
    args = parse("--max-queue", "7", "--api-key", "k9:gamma")
    assert args.max_queue == 7 and args.api_keys == ["k9:gamma"]


def test_defaults_without_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("LOOKUPSPEC_REDIS_URL", "LOOKUPSPEC_API_KEYS", "LOOKUPSPEC_MAX_QUEUE", "LOOKUPSPEC_PORT"):
        monkeypatch.delenv(key, raising=False)
    args = parse()
    assert args.redis_url is None and args.api_keys is None and args.env_api_keys == []
    assert args.max_queue == 64 and args.port == 8000
    assert args.trace_iterations is None


def test_the_warm_up_does_the_first_requests_lazy_work(tiny_model) -> None:
    """Before the server is ready: a generation, the prompt byte bound (a parse of the tokenizer's
    JSON, ~0.4 s for SmolLM2, which the first request would otherwise pay) and a chat prompt."""
    from lookupspec.text import TextEngine
    from lookupspec.warmup import warm_text

    te = TextEngine.load(str(tiny_model))
    assert "prompt_bound" not in te.__dict__
    warm_text(te)
    assert "prompt_bound" in te.__dict__


def test_api_keys_map_to_namespaces() -> None:
    assert parse_api_keys(["sk:a:b:team-1", "k2:team-2"]) == {"sk:a:b": "team-1", "k2": "team-2"}
    for bad in (["nokey"], [":ns"], ["k:"], ["k:bad namespace"], ["k:a", "k:b"]):
        with pytest.raises(ValueError):
            parse_api_keys(bad)
    assert not GatewayConfig(model_name="m").auth_required


def test_a_bad_api_key_flag_is_an_error_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    assert serve.run(parse("--api-key", "missing-namespace", "--model", "./does-not-exist")) == 2
    assert "KEY:NAMESPACE" in capsys.readouterr().err
    assert serve.run(parse("--api-key", "k1:alpha", "--admin-key", "k1", "--model", "./does-not-exist")) == 2
    assert "--admin-key" in capsys.readouterr().err


def test_a_bad_environment_value_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOKUPSPEC_MAX_QUEUE", "lots")
    with pytest.raises(SystemExit, match="LOOKUPSPEC_MAX_QUEUE"):
        parse()


def test_a_prefill_stretch_is_off_or_above_one(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert parse("--prefill-stretch", "0").prefill_stretch == 0
    assert parse().prefill_stretch == 2.5
    with pytest.raises(SystemExit):
        parse("--prefill-stretch", "0.5")
    assert "must be 0 (off) or > 1" in capsys.readouterr().err
    monkeypatch.setenv("LOOKUPSPEC_PREFILL_STRETCH", "1")
    with pytest.raises(SystemExit, match="LOOKUPSPEC_PREFILL_STRETCH"):
        parse()
    with pytest.raises(ValueError, match="prefill_stretch"):
        GatewayConfig(model_name="m", prefill_stretch=0.9)


def test_a_prefix_block_size_is_at_most_the_prefill_chunk(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert parse().prefix_block_size is None  # the engine chooses (32 where chunks are free)
    assert parse("--prefix-block-size", "16").prefix_block_size == 16
    monkeypatch.setenv("LOOKUPSPEC_PREFIX_BLOCK_SIZE", "64")
    assert parse().prefix_block_size == 64
    with pytest.raises(SystemExit):
        parse("--prefix-block-size", "0")
    assert "must be >= 1" in capsys.readouterr().err
    args = parse("--prefix-block-size", "256", "--prefill-chunk", "128", "--model", "./does-not-exist")
    assert serve.run(args) == 2
    assert "--prefix-block-size (256) must be at most --prefill-chunk (128)" in capsys.readouterr().err


def test_a_trace_file_that_cannot_be_written_is_an_error_before_loading(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as err:
        parse("--trace-iterations", str(blocker / "trace.jsonl"))  # its directory is a file
    assert err.value.code == 2
    assert "--trace-iterations: cannot append to" in capsys.readouterr().err
    path = tmp_path / "new" / "dir" / "trace.jsonl"
    assert parse("--trace-iterations", str(path)).trace_iterations == str(path) and path.parent.is_dir()


def test_the_environments_trace_file_is_checked_only_when_it_is_used(
        monkeypatch: pytest.MonkeyPatch, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    env_path = tmp_path / "env" / "trace.jsonl"
    monkeypatch.setenv("LOOKUPSPEC_TRACE_ITERATIONS", str(env_path))
    flag_path = tmp_path / "flag.jsonl"
    assert parse("--trace-iterations", str(flag_path)).trace_iterations == str(flag_path)
    assert flag_path.exists() and not env_path.parent.exists()  # the flag wins; the other is not made
    with pytest.raises(SystemExit):
        parse("--help")
    assert not env_path.parent.exists()
    assert parse().trace_iterations == str(env_path) and env_path.exists()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("LOOKUPSPEC_TRACE_ITERATIONS", str(blocker / "trace.jsonl"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as err:
        parse()
    assert err.value.code == 2 and "--trace-iterations: cannot append to" in capsys.readouterr().err
