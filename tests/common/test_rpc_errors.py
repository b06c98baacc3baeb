"""One exception tree on both sides of a call: status codes in, exceptions out."""

from __future__ import annotations

import grpc
import pytest

from services.common.rpc.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    ServiceError,
    UnavailableError,
    error_from,
    status_for,
)

C = grpc.StatusCode


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (C.INVALID_ARGUMENT, InvalidArgumentError),
        (C.OUT_OF_RANGE, InvalidArgumentError),
        (C.FAILED_PRECONDITION, InvalidArgumentError),
        (C.NOT_FOUND, NotFoundError),
        (C.ALREADY_EXISTS, AlreadyExistsError),
        (C.PERMISSION_DENIED, PermissionDeniedError),
        (C.UNAUTHENTICATED, PermissionDeniedError),
        (C.RESOURCE_EXHAUSTED, ResourceExhaustedError),
        (C.UNAVAILABLE, UnavailableError),
        (C.DEADLINE_EXCEEDED, UnavailableError),
        (C.CANCELLED, UnavailableError),
        (C.INTERNAL, ServiceError),
        (C.UNIMPLEMENTED, ServiceError),
        (C.UNKNOWN, ServiceError),
    ],
)
def test_a_failed_call_becomes_the_exception_of_its_code(
    code: grpc.StatusCode, cls: type[ServiceError]
) -> None:
    rpc_error = grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "why")
    err = error_from(rpc_error)
    assert type(err) is cls
    assert (err.code, err.details, str(err)) == (code, "why", f"{code.name}: why")


def test_a_servicer_exception_becomes_its_status() -> None:
    assert status_for(NotFoundError("no client c1")) == (C.NOT_FOUND, "no client c1")
    assert status_for(UnavailableError("queue down", C.DEADLINE_EXCEEDED)) == (
        C.DEADLINE_EXCEEDED,
        "queue down",
    )
    assert status_for(ValueError("tenant is required")) == (
        C.INVALID_ARGUMENT,
        "tenant is required",
    )
    assert status_for(TimeoutError()) == (C.DEADLINE_EXCEEDED, "timed out")
    assert status_for(KeyError("x")) == (C.INTERNAL, "internal error: KeyError")
