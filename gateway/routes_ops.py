"""Operations routes (no API key needed): ``/health``, ``/ready``, ``/metrics``.

``/health`` is 200 while the engine works (the body says ``degraded`` when the shared store is, e.g.
Redis is unreachable: the replica still serves from memory) and 503 when the engine is dead.
``/ready`` is 200 when this replica should get traffic: the engine works and it is not draining.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from .metrics import CONTENT_TYPE
from .routing import ERRORS, service_of

__all__ = ["router"]

router = APIRouter()

_HEALTH_SCHEMA = {"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]}


@router.get("/health", responses={200: {"description": "engine alive (store may be degraded)",
                                        "content": {"application/json": {"schema": _HEALTH_SCHEMA}}},
                                  503: {"description": "engine dead",
                                        "content": {"application/json": {"schema": _HEALTH_SCHEMA}}},
                                  **ERRORS(400)})
async def health(request: Request, digest: bool = False) -> Any:
    """``digest=true`` adds the SHA-256 of this replica's store state (O(state): for checks, not
    for frequent probes); replicas that applied the same records report the same digest."""
    service = service_of(request)
    snap = service.snapshot()
    store = snap["store"]
    engine_ok = bool(snap["engine_ok"])
    status = "ok" if engine_ok and store.get("state") == "ok" else ("degraded" if engine_ok else "dead")
    body = {
        "status": status,
        "model": service.config.model_name,
        "engine": {"ok": engine_ok, "worker_alive": service.worker_alive},
        "queue": {"waiting": snap["queue_depth"], "running": snap["running"],
                  "max_queue": service.config.max_queue},
        "draining": bool(snap["draining"]),
        "store": store,
        "indexes": snap["indexes"],
    }
    if digest:
        body["digest"] = await run_in_threadpool(service.store.state.digest)
    return JSONResponse(body, status_code=200 if engine_ok else 503)


@router.get("/ready", responses={200: {"description": "ready for traffic",
                                       "content": {"application/json": {"schema": _HEALTH_SCHEMA}}},
                                 503: {"description": "not ready (draining or engine dead)",
                                       "content": {"application/json": {"schema": _HEALTH_SCHEMA}}}})
async def ready(request: Request) -> Any:
    service = service_of(request)
    ok = service.engine_ok and not service.draining
    status = "ready" if ok else ("draining" if service.draining else "engine unavailable")
    return JSONResponse({"status": status}, status_code=200 if ok else 503)


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}}},
                             "description": "Prometheus text format"}})
async def metrics(request: Request) -> Response:
    return Response(service_of(request).metrics.render(), media_type=CONTENT_TYPE)
