"""Real processes for the gateway tests: redis-server on a free port, and `lookupspec serve`.

Both follow tests/store/conftest.py: processes the tests start themselves on free loopback ports
(never 6379 or any server the tests did not start), logs in the test's directory, cleaned up at the
end. Imported by the gateway and client test suites (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from redis_harness import free_port

ROOT = Path(__file__).resolve().parents[1]
KEY_ALPHA, KEY_BETA = "sk-alpha-0123456789", "sk-beta-9876543210"
MODEL = "tiny-llama"  # the tiny model the servers serve (its directory name is its id)


class Gateway:
    """One ``lookupspec serve`` process. ``start()`` returns at once; ``wait_ready()`` polls /ready."""

    def __init__(self, model: Path, workdir: Path, *, args: Sequence[str] = (), name: str = "gateway",
                 port: int | None = None, data_dir: Path | None = None,
                 health_key: str | None = None) -> None:
        self.model = model
        self.health_key = health_key  # a key that may see /health's detail (servers with API keys)
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.args = list(args)
        self.name = name
        self.port = port or free_port()
        self.data_dir = data_dir or workdir / "data"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{name}.log"
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Gateway:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        env = dict(os.environ)
        env["LOOKUPSPEC_HOME"] = str(self.workdir / "home")
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("LOOKUPSPEC_API_KEYS", None)
        cmd = [sys.executable, "-m", "lookupspec.cli", "serve", "--model", str(self.model),
               "--port", str(self.port), "--data-dir", str(self.data_dir), "--log-level", "warning",
               *self.args]
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it; closed below
        try:
            log.write(f"\n=== start {self.starts}: {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=str(ROOT), env=env)
        finally:
            log.close()
        return self

    def wait_ready(self, timeout: float = 180.0) -> Gateway:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/ready", timeout=2.0).status_code == 200:
                    return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout} s:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def client(self, key: str | None = None, timeout: float = 60.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def health(self, **params: Any) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.health_key}"} if self.health_key else {}
        return httpx.get(self.url + "/health", params=params, headers=headers, timeout=10.0).json()

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {name{labels}: value}."""
        text = httpx.get(self.url + "/metrics", timeout=10.0).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM and wait (SIGKILL if it does not exit in time)."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill(self) -> None:
        """kill -9."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_all(*gateways: Gateway, timeout: float = 180.0) -> None:
    """Start several gateways at once (their start-ups overlap), then wait for all."""
    for g in gateways:
        g.start()
    for g in gateways:
        g.wait_ready(timeout)


def sse_events(response: httpx.Response) -> Iterator[Any]:
    """Parse an SSE body: yields each ``data:`` payload (JSON decoded, or the string "[DONE]")."""
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), f"not an SSE data line: {line!r}"
        payload = line[len("data: "):]
        yield payload if payload == "[DONE]" else json.loads(payload)
