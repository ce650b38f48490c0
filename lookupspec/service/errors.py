"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Bad input is a 4xx naming the offending ``param``; only a bug or a dead engine is a 5xx. The service
raises these; the gateway renders them (``gateway/errors.py``), the in-process client turns them into
``ClientError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ServiceError", "bad_request", "error_body", "not_found", "too_large"]

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
    504: "server_error",
}


class ServiceError(Exception):
    """A request the service refuses or a job that failed, in OpenAI's error shape: ``status`` is the
    HTTP status the gateway answers with (the in-process client raises it as a ``ClientError``)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> ServiceError:
    return ServiceError(400, message, param=param, code=code)


def not_found(message: str, param: str | None = None, code: str = "not_found") -> ServiceError:
    return ServiceError(404, message, param=param, code=code)


def too_large(message: str, param: str | None = None) -> ServiceError:
    return ServiceError(413, message, param=param, code="payload_too_large")
