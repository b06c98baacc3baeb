"""One place that maps domain errors to gRPC status codes.

Servicers raise these; `ErrorMappingInterceptor` turns them into a status with the message.
Outcomes a caller must branch on are enum values in replies, not errors (BifroMQ style).
"""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class InvalidArgumentError(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFoundError(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(ServiceError):
    code = grpc.StatusCode.ALREADY_EXISTS


class UnavailableError(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class PermissionDeniedError(ServiceError):
    code = grpc.StatusCode.PERMISSION_DENIED


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, ServiceError):
        return exc.code, str(exc)
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, "timed out"
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}"
