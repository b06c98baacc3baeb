"""One exception tree for failed calls, on both sides of the wire.

A servicer raises one of these (or `ValueError`, or `TimeoutError`) and
`ErrorAndTraceInterceptor` turns it into a status with the message (`status_for`). A client
gets the status back as the same exception (`error_from`, applied by `LazyStub.call` in
services/common/rpc/client.py), so callers catch `UnavailableError` or `NotFoundError`, never
`grpc.aio.AioRpcError`.

Only infrastructure failures and bad requests are errors. Outcomes a caller must branch on
(`RouteResult.TRY_LATER`, `ConnectResult.BAD_CREDENTIALS`, `LeaseResult.EXCEED_LIMIT`) are
enum values in the reply, which each client turns into domain values (BifroMQ style).
"""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    """A call failed. `code` is the gRPC status, `details` its message.

    Raised as is for codes with no subclass (INTERNAL, UNKNOWN, UNIMPLEMENTED, ...).
    """

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, details: str = "", code: grpc.StatusCode | None = None) -> None:
        super().__init__(details)
        self.details = details
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"


class InvalidArgumentError(ServiceError):
    """The request is wrong (the caller's bug or the operator's input); `details` names the
    field. Also OUT_OF_RANGE and FAILED_PRECONDITION."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(ServiceError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(ServiceError):
    """The admin token is missing or wrong (UNAUTHENTICATED), or not allowed this call."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnavailableError(ServiceError):
    """The service (or one it depends on) cannot be reached or did not answer in time
    (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED): trying again later may work."""

    code = grpc.StatusCode.UNAVAILABLE


_BY_CODE: dict[grpc.StatusCode, type[ServiceError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.FAILED_PRECONDITION: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: UnavailableError,
    grpc.StatusCode.CANCELLED: UnavailableError,
}


def error_for(code: grpc.StatusCode, details: str) -> ServiceError:
    """The exception for a failed call with `code`, keeping the exact code and message."""
    return _BY_CODE.get(code, ServiceError)(details, code)


def error_from(exc: grpc.aio.AioRpcError) -> ServiceError:
    """Client side: the exception for a failed gRPC call."""
    return error_for(exc.code(), exc.details() or "")


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """Server side: the status a servicer's exception becomes."""
    if isinstance(exc, ServiceError):
        return exc.code, exc.details
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, "timed out"
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}"
