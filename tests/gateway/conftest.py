"""Fixtures for the gateway tests: real `lookupspec serve` processes on tiny models, real redis-server
processes, clients. Servers are expensive to start (seconds), so the ones that tests only talk to are
shared per module; the tests that kill or restart servers start their own."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gateway_harness import MODEL, Gateway
from redis_harness import RedisServer


@pytest.fixture(scope="session")
def tiny_model(tiny_models: dict[str, Path]) -> Path:
    return tiny_models[MODEL]


@pytest.fixture(scope="session")
def text_engine(tiny_model: Path):
    """The in-process engine the servers' outputs are compared with."""
    from lookupspec.text import TextEngine

    return TextEngine.load(str(tiny_model))


@pytest.fixture
def gateways(tmp_path: Path, tiny_model: Path) -> Iterator[Callable[..., Gateway]]:
    """``gateways(name, *args, data_dir=None)``: a Gateway (not started) stopped after the test."""
    made: list[Gateway] = []

    def make(name: str, *args: str, data_dir: Path | None = None) -> Gateway:
        g = Gateway(tiny_model, tmp_path / name, args=args, name=name, data_dir=data_dir)
        made.append(g)
        return g

    yield make
    for g in made:
        with contextlib.suppress(Exception):
            g.kill()


@pytest.fixture(scope="module")
def redis_server(redis_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A Redis for one test module (its tests may stop and restart it)."""
    server = RedisServer(redis_binary, tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()
