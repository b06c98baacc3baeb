"""Pure aggregation of reports (connection nodes, and the session, router and queue services)
into cluster statistics.

Every reporter sends its latest figures per tenant; the cluster's figures are the sums over
the reporters heard from within `stale_s`. Counters (messages, bytes, drops, refusals,
latency buckets) are cumulative per reporter, gauges (connections, sessions, subscriptions,
retained, queue depth) current, so both sum the same way. The latency buckets' bounds are
the mesh's (services/common/latency_bounds.py): nodes count into them, the exporter names them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass(slots=True)
class TenantCounts:
    """One tenant's figures from one reporter, or summed over reporters. The integer fields
    are exactly the summable ones (`SUMMED`)."""

    connections: int = 0
    messages_in: int = 0
    messages_out: int = 0
    messages_dropped: int = 0
    msgs_in_q0: int = 0
    msgs_in_q1: int = 0
    msgs_in_q2: int = 0
    msgs_out_q0: int = 0
    msgs_out_q1: int = 0
    msgs_out_q2: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    dropped_slow_consumer: int = 0
    dropped_queue_full: int = 0
    dropped_too_large: int = 0
    expired: int = 0
    quota_refusals: int = 0
    sessions_persistent: int = 0
    sessions_online: int = 0
    sessions_offline: int = 0
    subscriptions: int = 0
    retained_messages: int = 0
    retained_bytes: int = 0
    queue_depth: int = 0
    queue_dropped: int = 0
    sessions_persistent_online: int = 0
    packets_in: int = 0
    wire_bytes_in: int = 0
    wire_bytes_out: int = 0
    connects: int = 0
    sessions_expired: int = 0
    dropped_quota: int = 0
    subscriptions_shared: int = 0  # of `subscriptions`, the `$share/...` ones
    # since the reporter's previous report (not cumulative): (topic, messages)
    top_topics: tuple[tuple[str, int], ...] = ()
    ack_latency_buckets: tuple[int, ...] = ()  # per bucket of LATENCY_BOUNDS_S, +Inf last
    ack_latency_sum_s: float = 0.0

    def add(self, other: TenantCounts) -> None:
        """Add `other`'s counters, gauges and latency histogram (not its top topics)."""
        for name in SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.ack_latency_buckets:
            mine = self.ack_latency_buckets or (0,) * len(other.ack_latency_buckets)
            n = max(len(mine), len(other.ack_latency_buckets))
            a = (*mine, *(0,) * (n - len(mine)))
            b = (*other.ack_latency_buckets, *(0,) * (n - len(other.ack_latency_buckets)))
            self.ack_latency_buckets = tuple(x + y for x, y in zip(a, b, strict=True))
        self.ack_latency_sum_s += other.ack_latency_sum_s


# Reporter kinds whose every instance holds the whole state (each router loads every
# tenant's routes and retained messages): one report counts, not the sum.
REPLICATED = frozenset({"router"})
SUMMED: tuple[str, ...] = tuple(f.name for f in fields(TenantCounts) if f.type == "int")


@dataclass(slots=True)
class ClusterStats:
    """Latest report per reporter; totals are computed over those reported within
    `stale_s`. A reporter's kind is "" for a connection node."""

    stale_s: float
    reports: dict[str, tuple[float, str, dict[str, TenantCounts]]] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)  # reporter -> resident bytes

    def report(
        self,
        node_id: str,
        now: float,
        tenants: dict[str, TenantCounts],
        kind: str = "",
        memory_bytes: int = 0,
    ) -> None:
        self.reports[node_id] = (now, kind, tenants)
        self.memory[node_id] = memory_bytes

    def memory_bytes(self, now: float) -> int:
        """Resident memory summed over the live reporters, every instance of every kind
        (each router instance holds the whole table, and each uses its own memory)."""
        return sum(
            self.memory.get(node_id, 0)
            for node_id, (at, _, _) in list(self.reports.items())
            if now - at <= self.stale_s
        )

    def totals(self, now: float) -> tuple[int, dict[str, TenantCounts]]:
        """(live connection nodes, per tenant sums over the live reporters). A replicated
        kind (every instance holds the same state: REPLICATED) counts once, from its most
        recent report. Safe to call from another thread than the one that reports: it
        reads a snapshot of the reports."""
        out: dict[str, TenantCounts] = {}
        nodes = 0
        latest: dict[str, tuple[float, dict[str, TenantCounts]]] = {}
        for at, kind, tenants in list(self.reports.values()):
            if now - at > self.stale_s:
                continue
            nodes += not kind
            if kind in REPLICATED:
                if kind not in latest or latest[kind][0] < at:
                    latest[kind] = (at, tenants)
                continue
            for tenant, c in list(tenants.items()):
                out.setdefault(tenant, TenantCounts()).add(c)
        for _, tenants in latest.values():
            for tenant, c in list(tenants.items()):
                out.setdefault(tenant, TenantCounts()).add(c)
        return nodes, out

    def live(self, now: float) -> dict[str, int]:
        """Live reporters per kind ("" for connection nodes)."""
        out: dict[str, int] = {}
        for at, kind, _ in list(self.reports.values()):
            if now - at <= self.stale_s:
                out[kind] = out.get(kind, 0) + 1
        return out
