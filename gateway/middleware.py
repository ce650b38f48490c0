"""Pure ASGI middleware: authentication, admission by lifecycle phase, the request body size limit,
request counting.

They run before routing and body parsing, so a missing key is a 401, a replica that is loading or
draining a 503, and an oversized body a 413 whatever else is wrong with the request, and an oversized
body is never read into memory whole. Order (outermost first): counting, auth, admission, body limit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lookupspec.service.metrics import ServiceMetrics

from .auth import Authenticator
from .errors import APIError
from .lifecycle import Lifecycle

__all__ = ["AdmissionMiddleware", "AuthMiddleware", "BodyLimitMiddleware", "RequestMetricsMiddleware"]

# Endpoint label of the request counter: a fixed set, so label cardinality stays bounded.
_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/collections", "/health",
              "/ready", "/metrics")


async def _send_error(send: Send, error: APIError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class AuthMiddleware:
    """``/v1/...`` requests get ``scope["state"]["namespace"]`` or a 401."""

    def __init__(self, app: ASGIApp, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            namespace = self.auth.namespace(headers.get("authorization"), headers.get("api-key"))
        except APIError as exc:
            await _send_error(send, exc)
            return
        scope.setdefault("state", {})["namespace"] = namespace
        await self.app(scope, receive, send)


class AdmissionMiddleware:
    """``/v1`` requests by the replica's phase (``lifecycle``): 503 ``loading`` until the service is
    built, 503 while failed, and while draining 503 ``shutting_down`` for everything but reads (GET,
    HEAD). Counts the ``/v1`` requests it lets through, for the drain."""

    _READS = ("GET", "HEAD", "OPTIONS")

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle) -> None:
        self.app = app
        self.lifecycle = lifecycle

    def _refusal(self, method: str) -> APIError | None:
        phase = self.lifecycle.phase
        if phase == "loading":
            return APIError(503, "the server is loading the model; retry shortly", code="loading",
                            headers={"Retry-After": "1"})
        if phase == "failed":
            return APIError(503, "the server failed to start", code="engine_unavailable")
        if phase in ("draining", "stopped") and method not in self._READS:
            return APIError(503, "the server is shutting down", code="shutting_down",
                            headers={"Retry-After": "1"})
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope["method"])
        if refusal is not None:
            await _send_error(send, refusal)
            return
        self.lifecycle.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.lifecycle.leave()


class BodyLimitMiddleware:
    """413 for a body over ``max_bytes``: at once from Content-Length, or while a chunked body is
    read (the app then never sees it). 408 when the client sends no part of the body for
    ``timeout_s`` seconds, and 503 ``shutting_down`` as soon as the replica drains (``lifecycle``):
    a client that stalls in the middle of its body holds neither a connection nor the drain."""

    _POLL_S = 0.1  # how often a stalled read looks at the lifecycle's phase

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 30.0,
                 lifecycle: Lifecycle | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.lifecycle = lifecycle

    def _error(self) -> APIError:
        return APIError(413, f"the request body exceeds the limit of {self.max_bytes} bytes",
                        code="payload_too_large")

    def _draining(self) -> bool:
        return self.lifecycle is not None and self.lifecycle.phase in ("draining", "stopped")

    async def _receive(self, receive: Receive) -> Message | APIError:
        """The next message, or the error to answer when the client stalls or the replica drains."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        task = asyncio.ensure_future(receive())
        try:
            while True:
                left = deadline - loop.time()
                done, _ = await asyncio.wait({task}, timeout=min(self._POLL_S, max(left, 0.0)))
                if done:
                    return task.result()
                if self._draining():
                    return APIError(503, "the server is shutting down", code="shutting_down",
                                    headers={"Retry-After": "1", "Connection": "close"})
                if loop.time() >= deadline:
                    return APIError(408, f"the request body was not received: nothing arrived for "
                                         f"{self.timeout_s:g} s", code="request_timeout",
                                    headers={"Connection": "close"})
        finally:
            if not task.done():
                task.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        for key, value in scope["headers"]:
            if key.lower() == b"content-length":
                try:
                    too_big = int(value) > self.max_bytes
                except ValueError:
                    too_big = False
                if too_big:
                    await _send_error(send, self._error())
                    return
        # Read the body up front (bounded in size and time), then replay it to the app.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self._receive(receive)
            if isinstance(message, APIError):
                await _send_error(send, message)
                return
            if message["type"] != "http.request":
                break  # disconnect: let the app see an empty body and the disconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _send_error(send, self._error())
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class RequestMetricsMiddleware:
    """Counts answered requests by endpoint and status code."""

    def __init__(self, app: ASGIApp, metrics: Callable[[], ServiceMetrics]) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = next((e for e in _ENDPOINTS if path == e or path.startswith(e + "/")), "other")

        async def send_counting(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics().requests.labels(endpoint=endpoint, status=str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, send_counting)
