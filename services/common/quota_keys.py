"""Redis keys of the quota service that other services read too: the session service's
CONNECT script reads a tenant's `max_connections` (services/session/registry_keys.py), and
the subscription count (services/common/subscription_counts.py) sits beside the limits. The
quota service (services/quota/api.py, key_migration.py) writes them.

Every key of a tenant carries the tenant as its Redis Cluster hash tag (`{tenant}`), so a
script that reads a tenant's limits and writes its counters (the lease script, the session
registry's claim) touches one slot."""

from __future__ import annotations


def scope(tenant: str, user: str = "") -> str:
    """The prefix of a tenant's (or one of its users') quota keys."""
    if user:
        return f"st:quota:{{{tenant}}}:u:{user}"
    return f"st:quota:{{{tenant}}}"


def limits_key(tenant: str, user: str = "") -> str:
    """The Redis hash of a tenant's limits (or of one of its users)."""
    return f"{scope(tenant, user)}:limits"
