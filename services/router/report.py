"""What the router reports to the metrics service per tenant (services/metrics): the
subscriptions and sessions of its route table (persistent sessions: transient clients'
subscriptions are their nodes' to report) and the retained messages it holds. Every router
instance holds the whole table, so the metrics service takes one router's figures, not the
sum (services/metrics/core.py)."""

from __future__ import annotations

from services.common.refusals import Refusals
from services.common.route_table import RouteTable
from services.metrics.client import TenantCounters
from services.router.retained import RetainedIndex


def router_figures(
    table: RouteTable, retained: RetainedIndex, refusals: Refusals
) -> list[TenantCounters]:
    sessions = table.sessions_by_tenant()
    refused = refusals.quota_by_tenant()
    tenants = sorted({*table.tenants(), *retained.tenants(), *refused} - {"", "-"})
    return [
        TenantCounters(
            tenant=t,
            subscriptions=table.count(t),
            subscriptions_shared=table.count_shared(t),
            sessions_persistent=sessions.get(t, 0),
            retained_messages=retained.count(t),
            retained_bytes=retained.size(t),
            quota_refusals=refused.get(t, 0),
        )
        for t in tenants
    ]
