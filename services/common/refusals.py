"""Counts of requests refused by a resource limit, per (limit, tenant), and their export as
the Prometheus counter `starling_limit_refusals_total{limit, tenant}`.

Each service counts the refusals it decides (the session service: connections per tenant and
client id ownership; the router: retained and delayed messages; a connection node:
connections per address and every per-connection limit, by setting name), so an operator
sees which limit bites and for whom. Refusals made before a client authenticated carry the
tenant "-".
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import metrics

UNKNOWN_TENANT = "-"
# The `limit` labels of refusals by a tenant's (or user's) quota (docs/quota.md), as opposed
# to the per-connection and per-setting limits: summed into the tenant's `quota_refusals`.
QUOTA_LIMITS = frozenset(
    {
        "messages_per_s",
        "bytes_in_per_s",
        "bytes_out_per_s",
        "max_connections",
        "max_connections_per_user",
        "max_sessions",
        "subscriptions_per_client",
        "max_queue_depth",
        "max_queued_bytes",
        "max_tenant_subscriptions",
        "max_retained_messages",
        "max_retained_bytes",
    }
)


class Refusals:
    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}

    def count(self, limit: str, tenant: str = UNKNOWN_TENANT, n: int = 1) -> None:
        key = (limit, tenant or UNKNOWN_TENANT)
        self._counts[key] = self._counts.get(key, 0) + n

    def get(self, limit: str, tenant: str = UNKNOWN_TENANT) -> int:
        return self._counts.get((limit, tenant or UNKNOWN_TENANT), 0)

    def items(self) -> list[tuple[tuple[str, str], int]]:
        return sorted(self._counts.items())

    def quota_by_tenant(self) -> dict[str, int]:
        """Refusals by a quota (QUOTA_LIMITS) per tenant, since the process started."""
        out: dict[str, int] = {}
        for (limit, tenant), n in list(self._counts.items()):
            if limit in QUOTA_LIMITS:
                out[tenant] = out.get(tenant, 0) + n
        return out


def register_refusal_metrics(refusals: Refusals, meter_name: str) -> None:
    """Export `refusals` through the process's meter provider (scraped at /metrics)."""

    def observe(_o: object) -> Iterable[metrics.Observation]:
        for (limit, tenant), n in refusals.items():
            yield metrics.Observation(n, {"limit": limit, "tenant": tenant})

    metrics.get_meter(meter_name).create_observable_counter(
        "starling_limit_refusals",
        [observe],
        description="Requests refused by a resource limit (connections, retained, delayed)",
    )
