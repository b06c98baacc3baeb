"""Checks of the arguments every admin servicer takes, answered as gRPC INVALID_ARGUMENT with
a message naming the field: one place, so every service refuses the same inputs alike."""

from __future__ import annotations

from services.common.rpc.errors import InvalidArgumentError
from services.common.tenant_name import check_tenant


def required(value: str, name: str) -> str:
    """`value`, refused when empty ("<name> is required")."""
    if not value:
        raise InvalidArgumentError(f"{name} is required")
    return value


def tenant_argument(value: str) -> str:
    """A request's tenant: required, and a tenant name (services/common/tenant_name.py)."""
    required(value, "tenant")
    try:
        check_tenant(value)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None
    return value
