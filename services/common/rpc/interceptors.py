"""gRPC server interceptors: admin token, error mapping and tracing, in that order."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from opentelemetry import context, trace

from services.common.rpc.errors import status_for
from services.common.telemetry import extract

log = logging.getLogger(__name__)
_tracer = trace.get_tracer("starling.rpc")

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]


def _is_admin(method: str) -> bool:
    # "/starling.session.v1.SessionAdminService/CreateUser"
    service = method.rsplit("/", 2)[-2] if method.count("/") >= 2 else ""
    return service.endswith("AdminService")


def _wrap_unary(
    handler: grpc.RpcMethodHandler,
    fn: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        fn,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class AdminTokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Requires `authorization: Bearer <token>` on every *AdminService method."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if not self._token or handler is None or not _is_admin(details.method):
            return handler
        md = dict(details.invocation_metadata or ())
        given = str(md.get("authorization", ""))
        if hmac.compare_digest(given, f"Bearer {self._token}"):
            return handler

        async def deny(request: Any, ctx: grpc.aio.ServicerContext) -> Any:
            await ctx.abort(grpc.StatusCode.UNAUTHENTICATED, "admin token missing or wrong")

        return _wrap_unary(handler, deny)


class ErrorAndTraceInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Runs each unary call inside a server span and maps exceptions to status codes."""

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary
        method = details.method
        md = {k: str(v) for k, v in (details.invocation_metadata or ())}

        async def call(request: Any, ctx: grpc.aio.ServicerContext) -> Any:
            token = context.attach(extract(md))
            try:
                with _tracer.start_as_current_span(
                    method, kind=trace.SpanKind.SERVER, attributes={"rpc.method": method}
                ):
                    try:
                        return await inner(request, ctx)
                    except grpc.aio.AbortError:
                        raise
                    except Exception as exc:
                        code, message = status_for(exc)
                        if code == grpc.StatusCode.INTERNAL:
                            log.exception("rpc_failed", extra={"method": method})
                        await ctx.abort(code, message)
            finally:
                context.detach(token)

        return _wrap_unary(handler, call)


class ClientTraceInterceptor(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Adds a client span and W3C trace context metadata to outgoing unary calls."""

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        method = client_call_details.method
        name = method.decode() if isinstance(method, bytes) else str(method)
        span = trace.get_current_span()
        if not span.get_span_context().is_valid or not span.is_recording():
            return await continuation(client_call_details, request)
        with _tracer.start_as_current_span(name, kind=trace.SpanKind.CLIENT):
            from services.common.telemetry import inject

            md = list(client_call_details.metadata or ()) + list(inject().items())
            details = client_call_details._replace(metadata=md)
            return await continuation(details, request)
