"""A `lookupspec serve` child process for the HTTP benchmarks (``bench-gateway``, ``bench-serve``).

The server listens on a free loopback port, writes its stdout and stderr to ``log_path``, and gets
``threads`` torch threads through ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` (serve has no flag of its
own; torch reads them when it starts). ``wait_ready`` polls ``/ready``; ``stop`` sends SIGTERM (the
server drains) and kills it if it does not exit within a minute. ``api_key``: one of the keys given
in ``serve_args`` (``--api-key KEY:NAMESPACE``), for the server's own ``/v1`` calls (``model_id``).

The child runs this interpreter's lookupspec (:func:`child_python`), whatever the working directory
holds. To measure another checkout's server, run that checkout's own virtual environment
(``/path/to/checkout/.venv/bin/lookupspec bench-serve ...``), or point ``bench-serve`` at a server
already running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from lookupspec.benchmarks.http_client import bearer

__all__ = ["ServeProcess", "child_python", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_python() -> list[str]:
    """The interpreter command for a child process that must import the same lookupspec as this one.
    ``python -m`` puts the working directory first on the child's path, so a ``lookupspec/`` folder
    there would shadow the installed package; ``-P`` (Python 3.11) leaves it off."""
    return [sys.executable, "-P"]


class ServeProcess:
    """``lookupspec serve --model MODEL --port P --data-dir DATA_DIR SERVE_ARGS...``, started at once."""

    def __init__(self, model: str, data_dir: Path, log_path: Path, *, serve_args: Sequence[str] = (),
                 threads: int | None = None, api_key: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.headers = bearer(api_key)  # for /v1/models
        env = dict(os.environ)
        self.command = [*child_python(), "-m", "lookupspec.cli", "serve", "--model", model,
                        "--port", str(self.port), "--data-dir", str(data_dir), *serve_args]
        env["PYTHONUNBUFFERED"] = "1"
        if threads:
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)

    def wait_ready(self, timeout: float = 600.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the server exited with status {self.proc.returncode}:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"the server did not become ready in {timeout:g} s (log: {self.log_path})")

    def model_id(self) -> str:
        import httpx

        return httpx.get(self.url + "/v1/models", headers=self.headers, timeout=10).json()["data"][0]["id"]

    def stop(self) -> int | None:
        """SIGTERM, wait for the drain; the exit status (None if it had to be killed)."""
        status: int | None = self.proc.poll()
        if status is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                status = self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return status
