"""Errors in OpenAI's shape, and the handlers that turn every failure into one.

Every error response body is ``{"error": {"message", "type", "param", "code"}}``. Bad input is a 4xx
naming the offending ``param`` (request validation errors become 400, not FastAPI's 422); only a bug
or a dead engine is a 5xx.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = [
    "APIError",
    "bad_request",
    "error_body",
    "install_error_handlers",
    "not_found",
    "param_from_loc",
    "too_large",
]

log = logging.getLogger(__name__)

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


class APIError(Exception):
    """An error response: raise it anywhere in a request's path; the handler renders it."""

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

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def not_found(message: str, param: str | None = None, code: str = "not_found") -> APIError:
    return APIError(404, message, param=param, code=code)


def too_large(message: str, param: str | None = None) -> APIError:
    return APIError(413, message, param=param, code="payload_too_large")


def param_from_loc(loc: Sequence[Any]) -> str | None:
    """A pydantic error location -> OpenAI's param: ("body", "messages", 0, "content") ->
    "messages[0].content"; ("path", "name") -> "name"; the body itself -> None. Parts naming a
    union branch or validator ("constrained-str", "list[int]", "function-after[...]") are dropped:
    they are not request fields (no field of ours has "-" or "[" in its name)."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        elif isinstance(p, str) and p and not any(c in p for c in "-[("):
            if p in ("str", "int", "float", "bool", "list", "dict", "none"):
                continue
            out += f".{p}" if out else p
    return out or None


async def _api_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return exc.response()


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    # With union-typed fields pydantic reports one error per branch; the deepest location is the most
    # specific one (["a", ""] for stop: "stop[1] is too short", not "stop is not a string").
    first: dict[str, Any] = dict(max(errors, key=lambda e: len(e.get("loc", ())), default={}))
    loc = first.get("loc", ())
    param = param_from_loc(loc)
    msg = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if first.get("type") == "json_invalid":
        message, param = f"the request body is not valid JSON: {first.get('ctx', {}).get('error', msg)}", None
    elif first.get("type") == "missing":
        message = f"missing required parameter {param!r}" if param else "missing request body"
    else:
        message = f"invalid value for {param!r}: {msg}" if param else f"invalid request body: {msg}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more error(s))"
    return APIError(400, message, param=param, code="invalid_value").response()


def _unparsable_body(cause: BaseException | None) -> str:
    """What FastAPI's "There was an error parsing the body" was about (the error it chained)."""
    if isinstance(cause, UnicodeDecodeError):
        return f"the request body is not valid UTF-8 (byte {cause.start}): send JSON encoded as UTF-8"
    if isinstance(cause, RecursionError):
        return "the request body is nested too deeply to parse"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return f"the request body holds a number with too many digits ({cause})"
    return "the request body could not be parsed as JSON" + (f": {cause}" if cause else "")


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    codes = {400: "invalid_value", 404: "not_found", 405: "method_not_allowed", 401: "invalid_api_key"}
    message = exc.detail if isinstance(exc.detail, str) else "request failed"
    if exc.status_code == 400 and message == "There was an error parsing the body":
        message = _unparsable_body(exc.__cause__)
    if exc.status_code == 404 and message == "Not Found":
        message = "no such route"
    return APIError(exc.status_code, message, code=codes.get(exc.status_code),
                    headers=dict(exc.headers or {})).response()


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return APIError(500, "internal server error", code="internal_error").response()


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
