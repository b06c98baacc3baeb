"""Pure aggregation of node reports into cluster statistics."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TenantCounts:
    connections: int = 0
    messages_in: int = 0
    messages_out: int = 0
    messages_dropped: int = 0


@dataclass(slots=True)
class ClusterStats:
    """Latest report per node; totals are computed over nodes reported within `stale_s`."""

    stale_s: float
    reports: dict[str, tuple[float, dict[str, TenantCounts]]] = field(default_factory=dict)

    def report(self, node_id: str, now: float, tenants: dict[str, TenantCounts]) -> None:
        self.reports[node_id] = (now, tenants)

    def totals(self, now: float) -> tuple[int, dict[str, TenantCounts]]:
        out: dict[str, TenantCounts] = {}
        live = 0
        for at, tenants in self.reports.values():
            if now - at > self.stale_s:
                continue
            live += 1
            for tenant, c in tenants.items():
                t = out.setdefault(tenant, TenantCounts())
                t.connections += c.connections
                t.messages_in += c.messages_in
                t.messages_out += c.messages_out
                t.messages_dropped += c.messages_dropped
        return live, out
