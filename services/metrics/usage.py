"""Turns the reporters' cumulative reports into per-tenant hourly usage deltas (pure): the
difference from the reporter's previous report, attributed to the hour of the report;
connection time is the open connections times the time since the previous report. Top
topics are already per report: they are attributed to the hour as they come."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.store.ports_usage import USAGE_SUMMED, TopicDelta, UsageDelta
from services.metrics.core import TenantCounts

HOUR_MS = 3_600_000
# Counters whose delta is taken from the report (the rest of USAGE_SUMMED is connection_ms,
# computed here, and `dropped`, the report's messages_dropped).
_COUNTERS = tuple(c for c in USAGE_SUMMED if c not in ("connection_ms", "dropped"))


def hour_of(now_ms: int) -> int:
    return now_ms - now_ms % HOUR_MS


@dataclass
class UsageTracker:
    """The previous report of each reporter held in this process (one metrics instance;
    several share theirs through Redis instead, services/metrics/shared.py)."""

    # reporter -> (report time ms, tenant -> counters) of its previous report
    last: dict[str, tuple[int, dict[str, TenantCounts]]] = field(default_factory=dict)

    def deltas(
        self, node_id: str, now_ms: int, tenants: dict[str, TenantCounts]
    ) -> list[UsageDelta]:
        prev_at, prev = self.last.get(node_id, (now_ms, {}))
        self.last[node_id] = (now_ms, tenants)
        return usage_deltas(node_id, now_ms, tenants, prev_at, prev)


def usage_deltas(
    node_id: str,
    now_ms: int,
    tenants: dict[str, TenantCounts],
    prev_at: int,
    prev: dict[str, TenantCounts],
) -> list[UsageDelta]:
    """The usage a report adds over the reporter's previous one (`prev`, received at
    `prev_at`; none: empty, received now)."""
    hour = hour_of(now_ms)
    out = []
    for tenant, c in tenants.items():
        if not tenant:
            continue  # connections not yet authenticated belong to no tenant
        p = prev.get(tenant, TenantCounts())
        # A counter below its previous value: the reporter restarted and counts from 0.
        restarted = any(getattr(c, n) < getattr(p, n) for n in _COUNTERS)
        base = TenantCounts() if restarted else p
        d = UsageDelta(
            tenant,
            hour,
            node_id,
            c.connections,
            p.connections * max(0, now_ms - prev_at),
            dropped=max(0, c.messages_dropped - base.messages_dropped),
            **{n: getattr(c, n) - getattr(base, n) for n in _COUNTERS},
        )
        if d.connections or any(getattr(d, n) for n in USAGE_SUMMED):
            out.append(d)
    return out


def topic_counts(now_ms: int, tenants: dict[str, TenantCounts]) -> list[TopicDelta]:
    """A report's top topics as additions to the hour's `usage_topics` rows."""
    hour = hour_of(now_ms)
    return [
        TopicDelta(tenant, hour, topic, n)
        for tenant, c in tenants.items()
        if tenant
        for topic, n in c.top_topics
        if n
    ]
