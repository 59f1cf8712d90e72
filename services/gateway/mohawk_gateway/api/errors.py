"""Every error as OpenAI's body `{"error": {"message", "type", "param", "code"}}`, never a traceback.

FastAPI's validation errors become 400 (as with OpenAI and vLLM, never 422) naming the first
offending field; malformed JSON is 400 too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from mohawk_common.errors import InvalidRequestError
from mohawk_gateway.errors import GatewayError, invalid

log = structlog.get_logger("mohawk.gateway")

CLIENT_CLOSED_REQUEST = 499


class ClientDisconnected(Exception):
    """The client went away before its answer was ready."""


def error_response(error: GatewayError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def describe_validation(errors: Sequence[Any]) -> GatewayError:
    """One 400 for the first validation error, naming the field as `messages[0].content`."""
    error = dict(errors[0]) if errors else {}
    loc = list(error.get("loc") or ())
    if loc and loc[0] == "body":
        loc = loc[1:]
    kind = str(error.get("type", ""))
    if kind == "json_invalid":
        reason = (error.get("ctx") or {}).get("error", "invalid JSON")
        return invalid(f"malformed JSON body: {reason}")
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    if not loc:
        if kind == "missing":
            return invalid("a JSON body is required")
        if kind in ("model_attributes_type", "dict_type", "model_type"):
            return invalid("the request body must be a JSON object")
        return invalid(f"invalid request: {message}")
    param = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    if kind == "missing":
        return invalid(f"'{param}' is required", param)
    return invalid(f"invalid value for '{param}': {message}", param)


async def _gateway_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, GatewayError):
        raise exc
    return error_response(exc)


async def _validation_error(request: Request, exc: Exception) -> Response:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    return error_response(describe_validation(errors))


async def _invalid_request(request: Request, exc: Exception) -> Response:
    return error_response(invalid(str(exc)))


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "error"
    headers = dict(exc.headers or {}) if isinstance(exc, HTTPException) else {}
    error = GatewayError(status, str(detail), headers=headers)
    if status == 404:
        error.message = f"no route for {request.method} {request.url.path}"
    return error_response(error)


async def _client_gone(request: Request, exc: Exception) -> Response:
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", path=request.url.path, exc_info=exc)
    return error_response(GatewayError(500, "internal error", code="internal_error"))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(InvalidRequestError, _invalid_request)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(ClientDisconnected, _client_gone)
    app.add_exception_handler(Exception, _internal_error)
