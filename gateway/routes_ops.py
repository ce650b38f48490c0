"""Operations routes: ``/health``, ``/ready``, ``/metrics`` (GET and HEAD; no API key needed).

``/health`` is liveness: 200 while the process can serve or is loading (``status`` "loading"), 503
when the engine is dead or start-up failed. Its ``status`` says ``degraded`` when the shared store is
(e.g. Redis is unreachable: the replica still serves from memory). Without credentials, when API
keys are configured, the body is only ``{"status": ...}``; the detail (queue, store, indexes, the
data directory) and ``digest=true`` need a key (``auth.Authenticator.may_see_detail``).

``/ready`` is readiness, 200 only when this replica should get traffic: its service runs, the
engine works, it is not draining, and its store has caught up with the shared log at least once
since start (``synced``: a replica that started while Redis was down has replayed nothing yet and
answers 503 ``syncing`` until it has read the streams to their end; a replica that loses Redis
later stays ready, serving from memory, and reports ``degraded`` in ``/health``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from lookupspec.service.metrics import CONTENT_TYPE

from .errors import APIError
from .lifecycle import Lifecycle
from .routing import ERRORS

__all__ = ["router"]

router = APIRouter()

_STATUS_SCHEMA = {"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _lifecycle(request: Request) -> Lifecycle:
    return request.app.state.lifecycle


def _health(lifecycle: Lifecycle) -> tuple[int, dict[str, Any]]:
    """(status code, full body) of /health."""
    service = lifecycle.service
    if service is None:  # loading or failed
        body: dict[str, Any] = {"status": lifecycle.phase}
        if lifecycle.failure:
            body["error"] = lifecycle.failure
        return (200 if lifecycle.phase == "loading" else 503), body
    snap = service.snapshot()
    store = snap["store"]
    engine_ok = bool(snap["engine_ok"])
    status = "ok" if engine_ok and store.get("state") == "ok" else ("degraded" if engine_ok else "dead")
    return (200 if engine_ok else 503), {
        "status": status,
        "phase": lifecycle.phase,
        "model": service.config.model_name,
        "engine": {"ok": engine_ok, "worker_alive": service.worker_alive},
        "queue": {"waiting": snap["queue_depth"], "running": snap["running"],
                  "max_queue": service.config.max_queue},
        "draining": bool(snap["draining"]),
        "store": store,
        "indexes": snap["indexes"],
    }


def _may_see_detail(request: Request) -> bool:
    return request.app.state.auth.may_see_detail(request.headers.get("authorization"),
                                                 request.headers.get("api-key"))


@router.get("/health", responses={200: _json(_STATUS_SCHEMA, "alive (status: ok, degraded or loading)"),
                                  503: _json(_STATUS_SCHEMA, "engine dead or start-up failed"),
                                  **ERRORS(400, 401)})
async def health(request: Request, digest: bool = False) -> Any:
    """Liveness and, for callers allowed to see it, the replica's detail. ``digest=true`` adds the
    SHA-256 of this replica's store state (O(state): for checks, not for frequent probes); replicas
    that applied the same records report the same digest. Without API keys everything is shown;
    with keys, detail and digest need the admin key (or, without one, any valid key)."""
    lifecycle = _lifecycle(request)
    code, body = _health(lifecycle)
    detail = _may_see_detail(request)
    if digest and not detail:
        raise APIError(401, "digest=true needs the admin key (or, without one, a valid API key)",
                       param="digest", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    if not detail:
        return JSONResponse({"status": body["status"]}, status_code=code)
    if digest and lifecycle.service is not None:
        body["digest"] = await run_in_threadpool(lifecycle.service.store.state.digest)
    return JSONResponse(body, status_code=code)


@router.head("/health", include_in_schema=False)
async def health_head(request: Request) -> Response:
    """GET's status without its body: a wrong key is a 401 here too."""
    _may_see_detail(request)
    return Response(status_code=_health(_lifecycle(request))[0], media_type="application/json")


def _ready(lifecycle: Lifecycle) -> tuple[int, str]:
    service = lifecycle.service
    if lifecycle.phase in ("draining", "stopped") or (service is not None and service.draining):
        return 503, "draining"
    if service is None:
        return 503, lifecycle.phase  # loading or failed
    if not service.engine_ok:
        return 503, "engine unavailable"
    if not service.store.health().get("synced", True):
        return 503, "syncing"
    return 200, "ready"


@router.get("/ready", responses={200: _json(_STATUS_SCHEMA, "ready for traffic"),
                                 503: _json(_STATUS_SCHEMA, "not ready: loading, syncing (the shared store "
                                                            "not read yet), draining, or engine dead")})
async def ready(request: Request) -> Any:
    code, status = _ready(_lifecycle(request))
    return JSONResponse({"status": status}, status_code=code)


@router.head("/ready", include_in_schema=False)
async def ready_head(request: Request) -> Response:
    return Response(status_code=_ready(_lifecycle(request))[0], media_type="application/json")


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}}},
                             "description": "Prometheus text format"},
                       503: _json(_STATUS_SCHEMA, "loading: no metrics yet")})
async def metrics(request: Request) -> Response:
    service = _lifecycle(request).service
    if service is None:
        return JSONResponse({"status": _lifecycle(request).phase}, status_code=503)
    return Response(service.metrics.render(), media_type=CONTENT_TYPE)


@router.head("/metrics", include_in_schema=False)
async def metrics_head(request: Request) -> Response:
    """GET's status and content type without rendering the metrics."""
    if _lifecycle(request).service is None:
        return Response(status_code=503, media_type="application/json")
    return Response(status_code=200, media_type=CONTENT_TYPE)
