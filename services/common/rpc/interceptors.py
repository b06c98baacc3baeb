"""gRPC server interceptors: mesh secret, admin auth, error mapping and tracing, in that order.

Doors: `grpc.health.v1.Health` is open (probes, `starling status`); every *AdminService method
needs an admin token (operator or tenant-scoped, services/common/rpc/admin_auth.py); every
other method (the internal APIs and reflection) needs the mesh secret
(services/common/rpc/credentials.py).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from opentelemetry import context, trace

from services.common.admin_tokens import PREFIX as TENANT_TOKEN_PREFIX
from services.common.clock import now_ms
from services.common.rpc import red
from services.common.rpc.admin_auth import TenantGrant, TokenResolver, tenant_of
from services.common.rpc.credentials import MESH_METADATA_KEY
from services.common.rpc.errors import status_for
from services.common.telemetry import extract
from services.common.tenant_name import check_tenant

log = logging.getLogger(__name__)
_tracer = trace.get_tracer("starling.rpc")

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]

HEALTH_SERVICE = "grpc.health.v1.Health"
# Admin services a tenant token may never call, whatever tenant the request names: minting
# or revoking tokens would let a tenant token outlive its own expiry.
OPERATOR_ONLY_SERVICES = frozenset({"starling.session.v1.TokenAdminService"})
# Methods a tenant token may never call: a tenant raising its own limits would void them.
OPERATOR_ONLY_METHODS = frozenset({"/starling.quota.v1.QuotaAdminService/SetLimits"})


def _service_of(method: str) -> str:
    # "/starling.session.v1.SessionAdminService/CreateUser"
    return method.rsplit("/", 2)[-2] if method.count("/") >= 2 else ""


def _is_admin(method: str) -> bool:
    return _service_of(method).endswith("AdminService")


def _metadata(details: grpc.HandlerCallDetails, key: str) -> str:
    for k, v in details.invocation_metadata or ():
        if k == key:
            return v.decode() if isinstance(v, bytes) else str(v)
    return ""


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _wrap_unary(
    handler: grpc.RpcMethodHandler,
    fn: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
) -> grpc.RpcMethodHandler:
    return grpc.unary_unary_rpc_method_handler(
        fn,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _deny(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> Any:
    """A handler of the same kind as `handler` that fails every call with (code, message)."""

    async def unary(request: Any, ctx: grpc.aio.ServicerContext) -> Any:
        await ctx.abort(code, message)

    async def streaming(request: Any, ctx: grpc.aio.ServicerContext) -> Any:
        await ctx.abort(code, message)
        yield  # pragma: no cover - makes this an async generator

    kinds = {
        (False, False): (grpc.unary_unary_rpc_method_handler, unary),
        (False, True): (grpc.unary_stream_rpc_method_handler, streaming),
        (True, False): (grpc.stream_unary_rpc_method_handler, unary),
        (True, True): (grpc.stream_stream_rpc_method_handler, streaming),
    }
    make, fn = kinds[(bool(handler.request_streaming), bool(handler.response_streaming))]
    return make(
        fn,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class MeshSecretInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Internal methods need `x-starling-mesh-secret: <mesh secret>`; `secret=None` turns the
    check off (mesh_auth=disabled). Health stays open; admin methods have their own door."""

    def __init__(self, secret: str | None) -> None:
        self._secret = secret

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or self._secret is None:
            return handler
        service = _service_of(details.method)
        if service == HEALTH_SERVICE or service.endswith("AdminService"):
            return handler
        # An empty configured secret matches nothing: a missing setting never opens the door.
        if self._secret and _same(_metadata(details, MESH_METADATA_KEY), self._secret):
            return handler
        return _deny(
            handler,
            grpc.StatusCode.UNAUTHENTICATED,
            f"{details.method} is internal: the mesh secret is missing or wrong",
        )


class AdminAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Every *AdminService method needs `authorization: Bearer <token>`: the operator token
    (every tenant) or a tenant token from `tokens` (the tenant it names, checked against the
    request). `disabled=True` (admin_auth=disabled) lets every caller through."""

    def __init__(
        self, operator_token: str, *, disabled: bool = False, tokens: TokenResolver | None = None
    ) -> None:
        self._operator = operator_token
        self._disabled = disabled
        self._tokens = tokens

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or not _is_admin(details.method):
            return handler
        handler = _tenant_named(handler)
        if self._disabled:
            return handler
        given = _metadata(details, "authorization")
        token = given[7:] if given[:7].lower() == "bearer " else ""
        if token and self._operator and _same(token, self._operator):
            return handler
        if not token.startswith(TENANT_TOKEN_PREFIX) or self._tokens is None:
            return _deny(handler, grpc.StatusCode.UNAUTHENTICATED, "admin token missing or wrong")
        grant = await _resolve(self._tokens, token)
        if not isinstance(grant, TenantGrant):
            code, message = grant
            return _deny(handler, code, message)
        method = details.method
        if _service_of(method) in OPERATOR_ONLY_SERVICES or method in OPERATOR_ONLY_METHODS:
            return _deny(
                handler,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method} needs the operator token; token {grant.token_id} "
                f"administers tenant {grant.tenant!r} only",
            )
        if handler.unary_unary is None:
            return _deny(handler, grpc.StatusCode.PERMISSION_DENIED, "operator token only")
        return _tenant_scoped(handler, method, grant)


async def _resolve(tokens: TokenResolver, token: str) -> TenantGrant | tuple[grpc.StatusCode, str]:
    """The grant of a tenant token, or the status that refuses the call."""
    try:
        grant = await tokens.resolve(token)
    except Exception as exc:  # the session service cannot answer: say so, do not guess
        log.warning("admin_token_unresolved", extra={"error": str(exc)})
        return (
            grpc.StatusCode.UNAVAILABLE,
            "cannot check the admin token now (session service unavailable)",
        )
    if grant is None or grant.expired(now_ms()):
        return grpc.StatusCode.UNAUTHENTICATED, "admin token missing, wrong, expired or revoked"
    return grant


def _tenant_scoped(
    handler: grpc.RpcMethodHandler, method: str, grant: TenantGrant
) -> grpc.RpcMethodHandler:
    """`handler` for a tenant token's holder: a call naming another tenant (or none, one
    that spans every tenant) is refused with PERMISSION_DENIED."""
    inner = handler.unary_unary

    async def scoped(request: Any, ctx: grpc.aio.ServicerContext) -> Any:
        tenant = tenant_of(request)
        if tenant is None:
            await ctx.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method} spans every tenant: operator token only; token "
                f"{grant.token_id} administers tenant {grant.tenant!r} only",
            )
        if tenant != grant.tenant:
            log.info(
                "admin_tenant_denied",
                extra={"method": method, "token_id": grant.token_id, "tenant": tenant},
            )
            await ctx.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"token {grant.token_id} administers tenant {grant.tenant!r}, not {tenant!r}",
            )
        return await inner(request, ctx)

    return _wrap_unary(handler, scoped)


def _tenant_named(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """An admin call naming a tenant that cannot exist gets INVALID_ARGUMENT, whichever
    service it reaches: `quota set --tenant 'acme '` must not report success for a tenant
    whose clients it will never limit. (An empty tenant is each API's own business.)"""
    if handler.unary_unary is None:
        return handler
    inner = handler.unary_unary

    async def checked(request: Any, ctx: grpc.aio.ServicerContext) -> Any:
        tenant = tenant_of(request)
        if tenant:
            try:
                check_tenant(tenant)
            except ValueError as exc:
                await ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return await inner(request, ctx)

    return _wrap_unary(handler, checked)


class RedInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """RED metrics of each unary call (services/common/rpc/red.py). First in the chain, so
    calls the doors refuse count too (with their status code as the outcome)."""

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary
        method = details.method

        async def call(request: Any, ctx: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            outcome = "OK"
            try:
                return await inner(request, ctx)
            except grpc.aio.AbortError:
                code = ctx.code()
                outcome = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
                raise
            except asyncio.CancelledError:
                outcome = "CANCELLED"
                raise
            except Exception:
                outcome = "UNKNOWN"
                raise
            finally:
                red.record(method, outcome, time.perf_counter() - started, "grpc")

        return _wrap_unary(handler, call)


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
