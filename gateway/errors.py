"""Errors in OpenAI's shape, and the handlers that turn every failure into one.

Every error response body is ``{"error": {"message", "type", "param", "code"}}``. Bad input is a 4xx
naming the offending ``param`` (request validation errors become 400, not FastAPI's 422); only a bug
or a dead engine is a 5xx.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lookupspec.service.errors import ServiceError, bad_request, error_body, not_found, too_large

__all__ = [
    "APIError",
    "bad_request",
    "error_body",
    "install_error_handlers",
    "not_found",
    "param_from_loc",
    "response",
    "too_large",
]

log = logging.getLogger(__name__)

APIError = ServiceError  # the gateway's name for the service's error


def response(error: ServiceError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)

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
    return response(exc)


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
    return response(APIError(400, message, param=param, code="invalid_value"))


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
    return response(APIError(exc.status_code, message, code=codes.get(exc.status_code),
                    headers=dict(exc.headers or {})))


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return response(APIError(500, "internal server error", code="internal_error"))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
