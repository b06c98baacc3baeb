"""Turns the nodes' cumulative stats reports into per-tenant hourly usage deltas (pure): the
difference from the node's previous report, attributed to the hour of the report;
connection time is the open connections times the time since the previous report."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.store.sqlite_usage import UsageDelta
from services.metrics.core import TenantCounts

HOUR_MS = 3_600_000


@dataclass
class UsageTracker:
    # node -> (report time ms, tenant -> counters) of its previous report
    last: dict[str, tuple[int, dict[str, TenantCounts]]] = field(default_factory=dict)

    def deltas(
        self, node_id: str, now_ms: int, tenants: dict[str, TenantCounts]
    ) -> list[UsageDelta]:
        prev_at, prev = self.last.get(node_id, (now_ms, {}))
        self.last[node_id] = (now_ms, tenants)
        hour = now_ms - now_ms % HOUR_MS
        out = []
        for tenant, c in tenants.items():
            if not tenant:
                continue  # connections not yet authenticated belong to no tenant
            p = prev.get(tenant, TenantCounts())
            # A counter below its previous value: the node restarted and counts from zero.
            restarted = c.messages_in < p.messages_in or c.messages_out < p.messages_out
            base = TenantCounts() if restarted else p
            d = UsageDelta(
                tenant,
                hour,
                node_id,
                c.connections,
                p.connections * max(0, now_ms - prev_at),
                c.messages_in - base.messages_in,
                c.messages_out - base.messages_out,
                max(0, c.messages_dropped - base.messages_dropped),
            )
            if d.connections or d.connection_ms or d.messages_in or d.messages_out or d.dropped:
                out.append(d)
        return out
