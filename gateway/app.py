"""The FastAPI application.

Foundation stage: only ``GET /health`` exists (it reports the loaded model). The OpenAI-compatible
routes, the documents API and the shared store arrive with the gateway issue.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

__all__ = ["create_app"]


def create_app(text_engine: Any, *, model_name: str) -> FastAPI:
    app = FastAPI(title="lookupspec", version="0.1.0")
    app.state.text_engine = text_engine

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, "api": "health-only (foundation stage)"}

    return app
