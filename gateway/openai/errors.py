"""OpenAI-style errors: the ``{"error": {...}}`` body, status codes and FastAPI handlers.

OpenAI answers malformed requests with 400 (never FastAPI's 422), so clients and SDKs that
branch on OpenAI's codes behave the same against Cascade.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from cascade.protocol.limits import shortened
from cascade.protocol.request.options import describe_validation_error
from gateway.sessions.generation import (
    AtCapacity,
    GenerationFailed,
    KeyAtLimit,
    Overloaded,
    RequestRefused,
    RoundsLost,
    SessionBusy,
)

log = logging.getLogger(__name__)

DEFAULT_RETRY_AFTER_S = 1
"""Retry-After sent with 503 and 429 when the orchestrator gives no better hint."""


class APIError(Exception):
    """An error the gateway reports to the client as it is (status, message, param, code)."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(model: str, served: str | None = None) -> APIError:
    """404 for a request naming ``model``; ``served``: the model this gateway serves."""
    hint = f"; this server serves '{served}' (GET /v1/models lists it)" if served else ""
    return APIError(
        404,
        f"The model '{shortened(model)}' does not exist{hint}.",
        param="model",
        code="model_not_found",
    )


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object. The message may quote what the client sent, so a lone surrogate
    in it (JSON can carry one, UTF-8 cannot) is escaped rather than failing the response."""
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def as_api_error(exc: BaseException) -> APIError:
    """Maps any exception to what the client sees; unexpected ones hide their details."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RedisError):
        log.warning("session store unavailable: %s", exc)
        return APIError(503, "The session store is unavailable; please retry later.",
                        type="server_error", code="store_unavailable",
                        headers={"Retry-After": str(DEFAULT_RETRY_AFTER_S)})
    if isinstance(exc, RequestRefused):  # a pod's INVALID_ARGUMENT: the client must change it
        return bad_request(str(exc))
    if isinstance(exc, RoundsLost):
        return APIError(409, str(exc), code="rounds_lost")
    if isinstance(exc, SessionBusy):
        return APIError(409, str(exc), code="session_busy",
                        headers={"Retry-After": str(DEFAULT_RETRY_AFTER_S)})
    if isinstance(exc, KeyAtLimit):
        return APIError(429, str(exc), type="rate_limit_error", code="rate_limit_exceeded",
                        headers={"Retry-After": str(max(1, round(exc.retry_after)))})
    if isinstance(exc, AtCapacity):
        return APIError(429, str(exc) or "The verifiers are at capacity; please retry later.",
                        type="server_error", code="at_capacity",
                        headers={"Retry-After": str(DEFAULT_RETRY_AFTER_S)})
    if isinstance(exc, Overloaded):
        retry_after = getattr(exc, "retry_after", None) or DEFAULT_RETRY_AFTER_S
        return APIError(
            503,
            str(exc) or "The server is overloaded; please retry later.",
            type="server_error",
            code="overloaded",
            headers={"Retry-After": str(max(1, round(retry_after)))},
        )
    if isinstance(exc, GenerationFailed):
        return APIError(500, str(exc) or "Generation failed.", type="server_error")
    log.exception("unexpected error while generating", exc_info=exc)
    message = "The server had an error while processing the request."
    return APIError(500, message, type="server_error")


def error_response(exc: BaseException) -> JSONResponse:
    err = as_api_error(exc)
    body = error_body(err.message, err.type, err.param, err.code)
    return JSONResponse(body, status_code=err.status_code, headers=err.headers)


async def _validation_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    message, param = describe_validation_error(exc.errors())
    return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)


async def _http_exception_handler(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    message = str(exc.detail)
    if exc.status_code == 400:  # FastAPI could not read the body (not UTF-8, nested too deep)
        message = f"The request body could not be parsed as JSON ({message})."
    body = error_body(message, "invalid_request_error")
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _api_error_handler(_: Request, exc: Exception) -> JSONResponse:
    return error_response(exc)


def install_error_handlers(app: FastAPI) -> None:
    """Routes every error the HTTP layer raises to an OpenAI-shaped response."""
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_exception_handler)
    for exc_type in (APIError, AtCapacity, KeyAtLimit, SessionBusy, Overloaded, GenerationFailed,
                     RequestRefused, RoundsLost, RedisError):
        app.add_exception_handler(exc_type, _api_error_handler)
