"""Redis keys of the quota service that other services read too (the session service's
CONNECT script reads a tenant's `max_connections`)."""

from __future__ import annotations


def limits_key(tenant: str, user: str = "") -> str:
    """The Redis hash of a tenant's limits (or of one of its users)."""
    if user:
        return f"st:quota:{tenant}:u:{user}:limits"
    return f"st:quota:{tenant}:limits"
