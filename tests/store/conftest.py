"""Fixtures for the shared-store tests: real redis-server processes the tests start themselves
(never a server on 6379 or any other the tests did not start), and stores on either backend."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis_harness import RedisServer

from lookupspec.store import (
    EmbeddedConfig,
    EmbeddedLog,
    RedisConfig,
    RedisLog,
    Store,
)


@pytest.fixture(scope="session")
def redis_server(redis_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A server shared by the tests that never stop it; tests isolate themselves by key prefix."""
    server = RedisServer(redis_binary, tmp_path_factory.mktemp("redis-shared"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_redis_server(redis_binary: str, tmp_path: Path) -> Iterator[RedisServer]:
    """A server for one test, which may stop and restart it."""
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = RedisServer(redis_binary, workdir)
    server.start()
    yield server
    server.stop()


def fast_redis_config(url: str, prefix: str, **overrides: object) -> RedisConfig:
    """Short blocking reads and backoff so tests notice outages and recoveries quickly."""
    options: dict = {"key_prefix": prefix, "block_ms": 100, "backoff_initial": 0.02, "backoff_max": 0.2,
                     "page_size": 50}
    options.update(overrides)
    return RedisConfig(url, **options)


StoreFactory = Callable[..., Store]


@pytest.fixture
def store_closer() -> Iterator[Callable[[Store], Store]]:
    opened: list[Store] = []

    def track(store: Store) -> Store:
        opened.append(store)
        return store

    yield track
    for store in reversed(opened):
        with contextlib.suppress(Exception):
            store.close()


@pytest.fixture(params=["embedded", "redis"])
def open_backend(request: pytest.FixtureRequest, tmp_path: Path,
                 store_closer: Callable[[Store], Store]) -> StoreFactory:
    """``open_backend(**redis_overrides)`` opens and starts a store on this test's log: the same
    data directory (embedded) or the same server and key prefix (Redis) every time, so calling it
    again after ``close()`` is a restart and calling it twice is a second replica (Redis only)."""
    if request.param == "embedded":
        def open_embedded(**_: object) -> Store:
            store = store_closer(Store(EmbeddedLog(EmbeddedConfig(tmp_path / "data"))))
            store.start()
            return store

        return open_embedded

    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = f"test:{uuid.uuid4().hex[:12]}:"

    def open_redis(**overrides: object) -> Store:
        store = store_closer(Store(RedisLog(fast_redis_config(server.url, prefix, **overrides))))
        store.start()
        return store

    return open_redis


def _wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


@pytest.fixture
def wait_until() -> Callable[..., bool]:
    """``wait_until(predicate, timeout)``: poll until true; returns False on timeout."""
    return _wait_until


@pytest.fixture
def redis_config() -> Callable[..., RedisConfig]:
    """``redis_config(url, prefix, **overrides)``: a RedisConfig tuned for fast tests."""
    return fast_redis_config
