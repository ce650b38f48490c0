"""The FastAPI application: routes, middleware, error handlers, and the service's lifecycle.

``build_app(lifecycle, ...)`` serves a replica whose service may still be loading (``lookupspec serve``
binds first, then builds the service on a thread and hands it to the ``Lifecycle``);
``create_app(service)`` serves an already built ``Service`` (engine + store + indexes);
``build_service`` builds one from a loaded ``TextEngine`` and an opened store. The worker thread
starts with the service and stops with the app (lifespan), after the drain (``lifecycle``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import fields
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from lookupspec import __version__
from lookupspec.service.config import ServiceConfig
from lookupspec.service.metrics import ServiceMetrics
from lookupspec.service.service import Service, build_service
from lookupspec.store import Store

from . import routes_documents, routes_openai, routes_ops
from .auth import Authenticator
from .config import GatewayConfig
from .errors import install_error_handlers
from .lifecycle import Lifecycle
from .middleware import AdmissionMiddleware, AuthMiddleware, BodyLimitMiddleware, RequestMetricsMiddleware

__all__ = ["build_app", "build_service", "create_app"]


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema with its 422 responses removed: validation errors are 400 here."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description,
                             routes=app.routes)
        for path in schema.get("paths", {}).values():
            for op in path.values():
                op.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema


def build_app(lifecycle: Lifecycle, *, auth: Authenticator, max_body_bytes: int,
              drain_timeout_s: float = 30.0, body_timeout_s: float = 30.0,
              store: Store | None = None) -> FastAPI:
    """The app serving ``lifecycle``'s service (which may arrive later). ``store`` is closed when
    the app stops, after the service (so outputs appended at the end still reach it). A request body
    that stalls for ``body_timeout_s`` gets 408 (``BodyLimitMiddleware``)."""
    loading_metrics = ServiceMetrics()  # counts requests until the service (and its metrics) exist

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        lifecycle.start()
        try:
            yield
        finally:
            lifecycle.close(timeout=max(drain_timeout_s, 1.0))
            if store is not None:
                store.close()

    # redirect_slashes=False: Starlette's redirect of "/v1/collections/" to "/v1/collections" builds an
    # absolute Location from the Host header, which a client controls; a 404 is the honest answer.
    app = FastAPI(title="lookupspec", version=__version__, lifespan=lifespan, redirect_slashes=False,
                  description="OpenAI-compatible speculative-decoding gateway with lookup drafts.")
    app.state.lifecycle = lifecycle
    app.state.auth = auth
    app.include_router(routes_openai.router)
    app.include_router(routes_documents.router)
    app.include_router(routes_ops.router)
    install_error_handlers(app)
    # Starlette wraps in reverse order: the last added runs first.
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes, timeout_s=body_timeout_s,
                       lifecycle=lifecycle)
    app.add_middleware(AdmissionMiddleware, lifecycle=lifecycle)
    app.add_middleware(AuthMiddleware, auth=auth)
    app.add_middleware(RequestMetricsMiddleware,
                       metrics=lambda: lifecycle.service.metrics if lifecycle.service else loading_metrics)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def create_app(service: Service, config: GatewayConfig | None = None, *,
               close_store: bool = False) -> FastAPI:
    """The app serving an already built ``service``; ``config``: the HTTP side (None: the service's
    own config when it is a ``GatewayConfig``, else no authentication and the default limits). With
    ``close_store`` the store is closed when the app stops."""
    if config is None:
        config = service.config if isinstance(service.config, GatewayConfig) else \
            GatewayConfig(**{f.name: getattr(service.config, f.name) for f in fields(ServiceConfig)})
    return build_app(Lifecycle(service), auth=Authenticator.from_config(config),
                     max_body_bytes=config.limits.max_body_bytes, drain_timeout_s=config.drain_timeout_s,
                     body_timeout_s=config.limits.body_timeout_s,
                     store=service.store if close_store else None)
