"""A replica's lifecycle: ``loading`` -> ``ready`` -> ``draining`` -> ``stopped`` (or ``failed``).

``lookupspec serve`` binds its socket first and builds the service (model, store replay, warm-up) on
a background thread, so the replica answers from its first second:

- **loading**: ``/health`` is 200 ``{"status": "loading"}`` (alive, not ready), ``/ready`` is 503, and
  every ``/v1`` request gets 503 ``loading`` with ``Retry-After`` (``AdmissionMiddleware``).
- **ready**: the service runs. (``/ready`` also waits for the shared store: see ``routes_ops``.)
- **draining** (SIGTERM): the listener stays open. ``/health`` and ``/ready`` (503 ``draining``) are
  answered, new ``/v1`` writes and generations get 503 ``shutting_down``, reads are served. Requests
  already in flight finish, for up to the drain timeout; then the generations still running are cut:
  their clients get a 503 ``shutting_down`` error (a stream: an error event, then ``data: [DONE]``),
  and only once those answers are written (or a short grace period passed) does the server close
  its listener and exit.
- **failed**: the service could not be built; the process exits with ``exit_code``.

Drain bookkeeping is the number of ``/v1`` requests being answered (``enter`` / ``leave``, counted by
the admission middleware), so it covers streams whose generation is done but whose last events are
still being written, and does not depend on how the service runs its generations.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

from lookupspec.service.service import Service

__all__ = ["Lifecycle", "Phase"]

Phase = Literal["loading", "ready", "draining", "stopped", "failed"]


class Lifecycle:
    """Thread-safe: the loader thread calls ``set_ready`` / ``fail``, the event loop the rest."""

    def __init__(self, service: Service | None = None) -> None:
        """With a ``service`` (built already): ready at once. Without: loading until ``set_ready``."""
        self._lock = threading.Lock()
        self._service = service
        self.phase: Phase = "ready" if service is not None else "loading"
        self.failure: str | None = None
        self.exit_code = 0
        self.inflight = 0  # /v1 requests being answered; only touched on the event loop

    @property
    def service(self) -> Service | None:
        return self._service

    def start(self) -> None:
        """App start-up: run a service that was built before the app."""
        if self._service is not None:
            self._service.start()

    def set_ready(self, service: Service) -> bool:
        """The loader built ``service``: start it and take traffic. False (service not started) when
        the replica was stopped meanwhile; the caller then closes the service."""
        with self._lock:
            if self.phase != "loading":
                return False
            service.start()
            self._service = service
            self.phase = "ready"
            return True

    def fail(self, message: str, exit_code: int = 2) -> None:
        with self._lock:
            if self.phase == "loading":
                self.phase = "failed"
                self.failure = message
                self.exit_code = exit_code

    def begin_drain(self) -> bool:
        """SIGTERM: True when a drain began (the service was ready); False when there is nothing to
        drain (still loading, failed, or draining already)."""
        with self._lock:
            if self.phase != "ready" or self._service is None:
                return False
            self.phase = "draining"
            self._service.begin_drain()
            return True

    async def drain(self, timeout: float, grace: float = 5.0, poll: float = 0.05) -> None:
        """Wait until no request is in flight, at most ``timeout`` seconds; then cut the generations
        still running (their clients get 503 ``shutting_down``) and wait at most ``grace`` seconds
        for those answers to be written."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        while self.inflight and loop.time() < deadline:
            await asyncio.sleep(poll)
        if self._service is not None and self.inflight:
            self._service.cut_off()
            deadline = loop.time() + grace
            while self.inflight and loop.time() < deadline:
                await asyncio.sleep(poll)

    def close(self, timeout: float) -> None:
        """App shutdown: stop the service (its worker and output writer); a loader still running
        will not start one."""
        with self._lock:
            self.phase = "stopped" if self.phase != "failed" else "failed"
            service = self._service
        if service is not None:
            service.close(timeout=timeout)

    # ---- the admission middleware's bookkeeping ---------------------------------------------

    def enter(self) -> None:
        self.inflight += 1

    def leave(self) -> None:
        self.inflight -= 1
