"""Per-tenant counters of a node, and their export: reports to the metrics service every
`stats_interval_s`, and OpenTelemetry observables (scraped through the Prometheus endpoint).

Counters are kept per batch, not per message, on the hot path: `Ingress` adds a batch's
messages, QoS 1/2 counts and bytes to its tenant's `Tally` once per batch; deliveries, bytes
out and drops are counted by each connection's outbound side (a few integer adds per PUBLISH
written) and folded into the tenant's totals when the connection ends, as are the
packets and socket bytes each channel counts per read and per write (`$SYS` figures). Top
topics are sampled (services/connection/top_topics.py). The publish-to-ack latency of QoS 1/2
publishes is observed when the router's answer releases the ack (`acked`).
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Final

from opentelemetry import metrics

from services.common.latency_bounds import LATENCY_BOUNDS_S
from services.common.refusals import Refusals
from services.common.topics.share import SHARE_PREFIX
from services.connection.channel import Channel
from services.connection.channel.outbound import Outbound
from services.connection.conn import Conn
from services.connection.top_topics import TopTopics
from services.metrics.client import TenantCounters

log = logging.getLogger("starling.connection.stats")

_BOUNDS_MS: Final = tuple(b * 1000 for b in LATENCY_BOUNDS_S)


def _buckets() -> list[int]:
    return [0] * (len(LATENCY_BOUNDS_S) + 1)


@dataclass(slots=True)
class Tally:
    """A tenant's counters on this node (connections that ended, or the sum with the live
    ones). QoS 0 figures are the totals less QoS 1 and 2; slow-consumer drops are `dropped`
    less the other causes."""

    messages_in: int = 0
    messages_out: int = 0
    dropped: int = 0  # slow consumer + queue full + too large + quota
    in_q1: int = 0
    in_q2: int = 0
    bytes_in: int = 0
    out_q1: int = 0
    out_q2: int = 0
    bytes_out: int = 0
    dropped_queue_full: int = 0
    dropped_too_large: int = 0
    expired: int = 0
    ack_latency: list[int] = field(default_factory=_buckets)
    ack_latency_sum_ms: int = 0
    packets_in: int = 0  # MQTT packets of any type
    wire_bytes_in: int = 0  # socket bytes, every packet
    wire_bytes_out: int = 0
    connects: int = 0  # connections accepted (CONNACK 0)
    dropped_quota: int = 0  # QoS 0 dropped: the bytes_out_per_s budget was spent

    def add_outbound(self, ob: Outbound) -> None:
        """Add one connection's outbound counters."""
        self.messages_out += ob.sent
        self.out_q1 += ob.sent_q1
        self.out_q2 += ob.sent_q2
        self.bytes_out += ob.bytes_out
        self.dropped += ob.dropped
        self.dropped_queue_full += ob.dropped_queue_full
        self.dropped_too_large += ob.dropped_too_large
        self.dropped_quota += ob.dropped_quota
        self.expired += ob.expired

    def add_connection(self, ch: Channel) -> None:
        """Add one accepted connection's counters."""
        self.add_outbound(ch.outbound)
        self.packets_in += ch.packets_received
        self.wire_bytes_in += ch.bytes_received
        self.wire_bytes_out += ch.bytes_sent
        self.connects += 1

    def copy(self) -> Tally:
        return Tally(
            self.messages_in,
            self.messages_out,
            self.dropped,
            self.in_q1,
            self.in_q2,
            self.bytes_in,
            self.out_q1,
            self.out_q2,
            self.bytes_out,
            self.dropped_queue_full,
            self.dropped_too_large,
            self.expired,
            list(self.ack_latency),
            self.ack_latency_sum_ms,
            self.packets_in,
            self.wire_bytes_in,
            self.wire_bytes_out,
            self.connects,
            self.dropped_quota,
        )


class NodeStats:
    def __init__(self, conns: set[Conn], refusals: Refusals | None = None) -> None:
        self._conns = conns  # the registry's open connections
        self._closed: dict[str, Tally] = {}  # tenant -> totals, ended connections included
        self._topics: dict[str, TopTopics] = {}  # tenant -> busiest topics since the report
        # The node's refusal counts (quota ones are reported).
        self._refusals = refusals if refusals is not None else Refusals()

    def for_tenant(self, tenant: str) -> Tally:
        t = self._closed.get(tenant)
        if t is None:
            t = self._closed[tenant] = Tally()
        return t

    def topics_of(self, tenant: str) -> TopTopics:
        t = self._topics.get(tenant)
        if t is None:
            t = self._topics[tenant] = TopTopics()
        return t

    def acked(self, stamps: Sequence[tuple[str, int]]) -> None:
        """QoS 1/2 publishes whose PUBACK/PUBREC the router's answer released, by tenant and
        `published_at_ms`: their publish-to-ack latency (from the node's receipt, wall clock
        milliseconds)."""
        now_ms = time.time() * 1000
        tally = None
        tenant = None
        for of, published_at_ms in stamps:
            if of != tenant:
                tenant = of
                tally = self.for_tenant(tenant)
            assert tally is not None
            ms = max(0.0, now_ms - published_at_ms)
            tally.ack_latency[bisect_left(_BOUNDS_MS, ms)] += 1
            tally.ack_latency_sum_ms += int(ms)

    def connection_ended(self, conn: Conn) -> None:
        ch = conn.channel
        self.for_tenant(ch.tenant).add_connection(ch)

    def by_tenant(self) -> dict[str, Tally]:
        """Per tenant: closed connections' totals plus the live ones' counters."""
        out = {t: c.copy() for t, c in list(self._closed.items())}
        for conn in list(self._conns):
            ch = conn.channel
            if not ch.tenant:
                continue
            t = out.get(ch.tenant)
            if t is None:
                t = out[ch.tenant] = Tally()
            t.add_connection(ch)
        return out

    def connections_by_tenant(self) -> dict[str, int]:
        """Open connections per tenant ("" for those not yet authenticated)."""
        out: dict[str, int] = {}
        for conn in list(self._conns):
            t = conn.channel.tenant
            out[t] = out.get(t, 0) + 1
        return out

    def sessions_by_tenant(self) -> dict[str, tuple[int, int, int, int]]:
        """Per tenant: (clients connected with a session, those whose session is
        persistent, subscriptions of the others, of which shared). A persistent session's
        subscriptions are the router's to count (it holds them while the client is away
        too)."""
        out: dict[str, tuple[int, int, int, int]] = {}
        for conn in list(self._conns):
            ch = conn.channel
            if not ch.tenant:
                continue
            online, persistent, subs, shared = out.get(ch.tenant, (0, 0, 0, 0))
            if ch.persistent:
                persistent += 1
            else:
                filters = ch.subscriptions
                subs += len(filters)
                shared += sum(map(str.startswith, filters, repeat(SHARE_PREFIX)))
            out[ch.tenant] = (online + 1, persistent, subs, shared)
        return out

    def report(self) -> list[TenantCounters]:
        """Every tenant's figures; each tenant's top topics start again from empty."""
        conns = self.connections_by_tenant()
        sessions = self.sessions_by_tenant()
        refused = self._refusals.quota_by_tenant()
        tallies = self.by_tenant()
        out = []
        for t in sorted({*tallies, *conns, *refused} - {"-"}):
            c = tallies.get(t) or Tally()
            online, persistent, subs, shared = sessions.get(t, (0, 0, 0, 0))
            topics = self._topics.pop(t, None)
            out.append(
                TenantCounters(
                    tenant=t,
                    connections=conns.get(t, 0),
                    messages_in=c.messages_in,
                    messages_out=c.messages_out,
                    messages_dropped=c.dropped,
                    msgs_in_q0=c.messages_in - c.in_q1 - c.in_q2,
                    msgs_in_q1=c.in_q1,
                    msgs_in_q2=c.in_q2,
                    msgs_out_q0=c.messages_out - c.out_q1 - c.out_q2,
                    msgs_out_q1=c.out_q1,
                    msgs_out_q2=c.out_q2,
                    bytes_in=c.bytes_in,
                    bytes_out=c.bytes_out,
                    dropped_slow_consumer=(
                        c.dropped - c.dropped_queue_full - c.dropped_too_large - c.dropped_quota
                    ),
                    dropped_queue_full=c.dropped_queue_full,
                    dropped_too_large=c.dropped_too_large,
                    dropped_quota=c.dropped_quota,
                    expired=c.expired,
                    quota_refusals=refused.get(t, 0),
                    sessions_online=online,
                    sessions_persistent_online=persistent,
                    subscriptions=subs,
                    subscriptions_shared=shared,
                    top_topics=tuple(topics.take()) if topics is not None else (),
                    ack_latency_buckets=tuple(c.ack_latency),
                    ack_latency_sum_s=c.ack_latency_sum_ms / 1000,
                    packets_in=c.packets_in,
                    wire_bytes_in=c.wire_bytes_in,
                    wire_bytes_out=c.wire_bytes_out,
                    connects=c.connects,
                )
            )
        return out


ZERO_TENANTS = 10_000  # tenants whose connection gauge is kept at 0 once idle, at most


def register_metrics(stats: NodeStats) -> None:
    meter = metrics.get_meter("starling.connection")

    def by_tenant(attr: str) -> Callable[[object], Iterable[metrics.Observation]]:
        def observe(_o: object) -> Iterable[metrics.Observation]:
            for tenant, c in stats.by_tenant().items():
                yield metrics.Observation(getattr(c, attr), {"tenant": tenant})

        return observe

    for name, attr, description in (
        ("starling_messages_in", "messages_in", "PUBLISH packets accepted from clients"),
        ("starling_messages_out", "messages_out", "PUBLISH packets written to clients"),
        (
            "starling_messages_dropped",
            "dropped",
            "Deliveries dropped (slow consumer, queue full, too large)",
        ),
    ):
        meter.create_observable_counter(name, [by_tenant(attr)], description=description)

    # Tenants that had connections here: their gauge reads 0 once the last one leaves,
    # rather than vanishing (an alert on `== 0` would go stale). Bounded: past ZERO_TENANTS
    # the idle ones are forgotten.
    had: set[str] = set()

    def connections(_o: object) -> Iterable[metrics.Observation]:
        now = {tenant or "-": n for tenant, n in stats.connections_by_tenant().items()}
        if len(had | now.keys()) > ZERO_TENANTS:
            had.clear()
        had.update(now)
        for tenant in had:
            yield metrics.Observation(now.get(tenant, 0), {"tenant": tenant})

    meter.create_observable_gauge(
        "starling_connections", [connections], description="Open MQTT connections"
    )
