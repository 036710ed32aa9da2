"""One place that turns exceptions into gRPC status codes, for every service.

Caller mistakes are ValueErrors (the core's InvalidDraft and the protocol's RequestInvalid are
ones): INVALID_ARGUMENT with their message."""

from __future__ import annotations

import inspect
import logging

import grpc
from redis.exceptions import RedisError

log = logging.getLogger(__name__)


class StaleEpoch(Exception):
    """A message from an owner whose epoch has been superseded (FAILED_PRECONDITION)."""


class NotFound(LookupError):
    """What the request names does not exist, or no longer (NOT_FOUND)."""


class Overloaded(Exception):
    """The pod cannot take more work now (RESOURCE_EXHAUSTED)."""


class Unavailable(Exception):
    """No pod can serve the request now: draining, or none alive (UNAVAILABLE)."""


class DataLoss(Exception):
    """State a client already received is gone from the store (DATA_LOSS)."""


class Unauthenticated(Exception):
    """Missing or wrong credentials (UNAUTHENTICATED)."""


class PermissionDenied(Exception):
    """An authenticated caller asked for something it may not do (PERMISSION_DENIED)."""


STATUS_FOR = (
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (StaleEpoch, grpc.StatusCode.FAILED_PRECONDITION),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (Overloaded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (RedisError, grpc.StatusCode.UNAVAILABLE),  # Redis down or unreachable: retry later
    (DataLoss, grpc.StatusCode.DATA_LOSS),
)


def status_for(exc: BaseException) -> grpc.StatusCode:
    for kind, code in STATUS_FOR:
        if isinstance(exc, kind):
            return code
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code()  # a downstream call failed: pass its status on
    return grpc.StatusCode.INTERNAL


async def _abort(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    code = status_for(exc)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("internal error", exc_info=exc)
    details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    await context.abort(code, details or type(exc).__name__)


def _wrap_unary(behavior):
    async def wrapped(request, context):
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a status, never swallowed
            await _abort(context, exc)

    return wrapped


def _wrap_stream(behavior):
    async def wrapped(request, context):
        try:
            replies = behavior(request, context)
            if inspect.isawaitable(replies):  # a servicer that writes with context.write
                await replies  # (grpc_health's Watch) rather than yielding
                return
            async for item in replies:
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001
            await _abort(context, exc)

    return wrapped


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps exceptions raised by servicers to status codes with their message as details."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return rewrapped(handler, _wrap_unary, _wrap_stream)


def rewrapped(handler: grpc.RpcMethodHandler, wrap_unary, wrap_stream) -> grpc.RpcMethodHandler:
    """``handler`` with its behaviour passed through ``wrap_unary`` (calls answered once) or
    ``wrap_stream`` (calls answered with a stream): for interceptors that change every kind of
    call the same way."""
    if handler.unary_unary:
        return handler._replace(unary_unary=wrap_unary(handler.unary_unary))
    if handler.stream_unary:
        return handler._replace(stream_unary=wrap_unary(handler.stream_unary))
    if handler.unary_stream:
        return handler._replace(unary_stream=wrap_stream(handler.unary_stream))
    return handler._replace(stream_stream=wrap_stream(handler.stream_stream))
