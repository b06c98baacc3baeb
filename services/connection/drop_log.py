"""Log lines for deliveries a connection dropped, each cause with the setting behind it.

Each connection's outbound side counts its drops (channel/outbound.py) and stats.py folds the
counts into the metrics; an operator reading the node's log saw nothing. `DropLog.scan` (the
node calls it with every stats report) writes one `deliveries_dropped` warning per connection
whose counts grew since the previous scan: how many, by cause, and what bounds each cause
(`max_queued_messages` and `max_queued_bytes` for a full queue, the client's Maximum Packet
Size, the bytes_out_per_s quota, the socket's write buffer for QoS 0). At most one line per
connection per scan, however many messages it dropped meanwhile.

Only connections that dropped something are remembered, and only while they are open.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import TypeVar

from services.connection.channel.outbound import Outbound
from services.connection.conn import Conn

log = logging.getLogger("starling.connection.drops")

# dropped, queue full, too large, quota (the rest of `dropped`: QoS 0 while congested)
Counts = tuple[int, int, int, int]
R = TypeVar("R")


def counts_of(ob: Outbound) -> Counts:
    return (ob.dropped, ob.dropped_queue_full, ob.dropped_too_large, ob.dropped_quota)


def causes(ob: Outbound, before: Counts) -> dict[str, str]:
    """Per cause that grew since `before`: how many, and the setting or limit behind it."""
    total, full, large, quota = (now - was for now, was in zip(counts_of(ob), before, strict=True))
    slow = total - full - large - quota
    out: dict[str, str] = {}
    if full:
        out["queue_full"] = (
            f"{full} QoS 1/2 beyond the client's window ({ob.receive_maximum} unacknowledged) "
            f"and queue: max_queued_messages={ob.max_queued}, "
            f"max_queued_bytes={ob.max_queued_bytes}"
        )
    if slow:
        out["slow_consumer"] = (
            f"{slow} QoS 0 while the client's socket was over its write buffer's high-water "
            "mark (QoS 0 is never queued; see slow_consumer_timeout_s)"
        )
    if large:
        out["too_large"] = f"{large} over the client's Maximum Packet Size ({ob.max_packet_size})"
    if quota:
        out["quota"] = f"{quota} QoS 0 over the tenant's or user's bytes_out_per_s quota"
    return out


class DropLog:
    __slots__ = ("_conns", "_seen")

    def __init__(self, conns: Collection[Conn]) -> None:
        self._conns = conns  # the registry's open connections (read only)
        self._seen: dict[Conn, Counts] = {}  # counts at the last scan, of those that dropped

    def before(self, report: Callable[[], R]) -> Callable[[], R]:
        """`report` (the node's stats report, every stats_interval_s), scanning first."""

        def scanned() -> R:
            self.scan()
            return report()

        return scanned

    def scan(self) -> int:
        """Log the connections whose drops grew since the last scan; returns how many."""
        seen = self._seen
        for gone in [c for c in seen if c not in self._conns]:
            del seen[gone]
        logged = 0
        for conn in list(self._conns):
            ob = conn.channel.outbound
            if not ob.dropped:
                continue
            now = counts_of(ob)
            before = seen.get(conn, (0, 0, 0, 0))
            if now == before:
                continue
            seen[conn] = now
            ch = conn.channel
            log.warning(
                "deliveries_dropped",
                extra={
                    "tenant": ch.tenant,
                    "client_id": ch.client_id,
                    "dropped": now[0] - before[0],
                    **causes(ob, before),
                },
            )
            logged += 1
        return logged
