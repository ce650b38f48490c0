"""The Makefile's torch source: PyTorch's CPU index when it answers, else pip's configured sources
(PyPI, or a local wheelhouse pip.conf names), decided in one short probe without retries; TORCH and
TORCH_INDEX choose. `make torch-source` prints the decision the install step takes. The indexes here
are real HTTP servers and sockets on loopback."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _torch_source(**variables: str) -> tuple[str, float]:
    """`make torch-source` with these variables: (its output line, seconds it took)."""
    cmd = ["make", "-s", "--no-print-directory", "-C", str(ROOT), "torch-source", f"PYTHON={sys.executable}",
           *(f"{k}={v}" for k, v in variables.items())]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip(), time.monotonic() - t0


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def _simple_index(root: Path) -> Iterator[str]:
    """A PEP 503 index with a `torch/` page, served from ``root``; yields its URL."""
    (root / "torch").mkdir()
    (root / "torch" / "index.html").write_text("<html><body></body></html>\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_torch_comes_from_the_index_when_it_answers(tmp_path: Path) -> None:
    with _simple_index(tmp_path) as url:
        out, _ = _torch_source(TORCH_INDEX=url)
        assert out == f"torch==2.13.0 from {url}"
        # the knob a GPU machine uses: another index and requirement, e.g. a CUDA build
        out, _ = _torch_source(TORCH_INDEX=url, TORCH="torch==2.13.0+cu128")
        assert out == f"torch==2.13.0+cu128 from {url}"


def test_an_unreachable_index_falls_back_to_the_configured_sources_at_once() -> None:
    with socket.socket() as s:  # a port nothing listens on: refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out, seconds = _torch_source(TORCH_INDEX=f"http://127.0.0.1:{port}/simple")
    assert out.startswith(f"torch==2.13.0 from pip's configured sources (http://127.0.0.1:{port}/simple "
                          "not reachable: ")
    assert "Connection refused" in out and seconds < 10


def test_an_index_that_never_answers_times_out_after_the_probe_timeout() -> None:
    with socket.socket() as s:  # accepts connections (the kernel's backlog) and never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        out, seconds = _torch_source(TORCH_INDEX=f"http://127.0.0.1:{s.getsockname()[1]}/",
                                     TORCH_PROBE_TIMEOUT="1")
    assert "from pip's configured sources" in out and "timed out" in out
    assert 1 <= seconds < 10, seconds  # one try of one second: no retries


def test_the_default_is_the_cpu_index_and_an_empty_index_means_the_configured_sources() -> None:
    out, _ = _torch_source(TORCH_PROBE_TIMEOUT="3")
    assert out.startswith("torch==2.13.0 from ") and CPU_INDEX in out  # from it, or not reachable
    out, _ = _torch_source(TORCH_INDEX="")
    assert out == "torch==2.13.0 from pip's configured sources (TORCH_INDEX is empty)"


@pytest.mark.parametrize("target", ["install", "install-test"])
def test_the_install_targets_install_torch_before_lookupspec(target: str) -> None:
    plan = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), target, f"PYTHON={sys.executable}"],
                          capture_output=True, text=True, timeout=60, check=True).stdout
    torch_step = plan.index("--index-url \"$index\" 'torch==2.13.0'")
    assert torch_step < plan.index("pip install --quiet -e ")
