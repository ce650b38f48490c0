"""Small helpers the route modules share: the service, the caller's namespace, error docs."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from lookupspec.service.service import Service

from .errors import APIError
from .protocol import ErrorResponse

__all__ = ["ERRORS", "namespace", "service_of"]

_DESCRIPTIONS = {
    400: "invalid request (param names the offending field)",
    401: "missing or invalid API key",
    404: "unknown model, collection, document or route",
    413: "request or document over a size limit",
    429: "queue full; retry after Retry-After seconds",
    503: "loading, shutting down, engine unavailable, or the shared store's buffer is full",
    504: "the request's deadline passed",
}


def ERRORS(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these error status codes (all OpenAI-shaped)."""
    return {code: {"model": ErrorResponse, "description": _DESCRIPTIONS[code]} for code in codes}


def service_of(request: Request) -> Service:
    """The running service. ``/v1`` routes only run once it exists (``AdmissionMiddleware``)."""
    service = request.app.state.lifecycle.service
    if service is None:
        raise APIError(503, "the server is loading the model; retry shortly", code="loading",
                       headers={"Retry-After": "1"})
    return service


def namespace(request: Request) -> str:
    """Dependency: the caller's namespace, set by ``middleware.AuthMiddleware``."""
    ns = request.scope.get("state", {}).get("namespace")
    if ns is None:  # a route outside /v1 that asked for a namespace: the default one
        return request.app.state.auth.default_namespace
    return ns
