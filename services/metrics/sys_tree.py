"""Mosquitto's `$SYS/broker/...` tree for one tenant, computed from its cluster figures (pure:
time comes in as an argument; services/metrics/sys_publisher.py publishes what it returns).

Meanings follow Mosquitto 2.0 (src/sys_tree.c), name for name; docs/metrics.md lists all 53
and says where each figure comes from:
- A value is published when it changed since the last publication (Mosquitto does the same),
  every value on the first one. `uptime` goes with every publication that has something
  else to say or while the tenant has clients connected, so an idle tenant costs nothing.
- Load averages are Mosquitto's exponential moving averages of a per-minute rate: over an
  interval of `dt` seconds in which a counter grew by `d`, `rate = d * 60 / dt` and
  `load = rate + exp(-dt / T) * (load - rate)` with T = 60, 300 or 900 s; published when it
  moved by 0.01 or more, as "%.2f". The first publication sets them to 0.00.
- `heap/current` is the cluster's memory (the resident memory of every live reporter), so
  only the operator tenant's tree has it and `heap/maximum` (the largest value seen, as
  `clients/maximum` is).
- Counters are sums over live reporters (services/metrics/core.py): when a node stops
  reporting, its part leaves the sum; a load never sees a negative growth (taken as 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from services.metrics.core import TenantCounts

Figure = Callable[[TenantCounts], int]

PREFIX = "$SYS/broker/"


def _connected(c: TenantCounts) -> int:
    return c.connections


def _disconnected(c: TenantCounts) -> int:
    # Persistent sessions with no connection: the router's persistent sessions less those
    # whose client is connected (nodes).
    return max(0, c.sessions_persistent - c.sessions_persistent_online)


def _total(c: TenantCounts) -> int:
    return _connected(c) + _disconnected(c)


def _dropped(c: TenantCounts) -> int:
    return c.messages_dropped + c.queue_dropped


def _stored(c: TenantCounts) -> int:
    return c.retained_messages + c.queue_depth


# Gauges and counters published as integers: (topic under PREFIX, figure). Aliases that
# Mosquitto keeps for old clients are listed as their own entries.
VALUES: tuple[tuple[str, Figure], ...] = (
    ("clients/connected", _connected),
    ("clients/active", _connected),
    ("clients/disconnected", _disconnected),
    ("clients/inactive", _disconnected),
    ("clients/total", _total),
    ("clients/expired", lambda c: c.sessions_expired),
    ("messages/stored", _stored),
    ("store/messages/count", _stored),
    ("store/messages/bytes", lambda c: c.retained_bytes),
    # Mosquitto counts shared subscriptions apart from the others: so does Starling.
    ("subscriptions/count", lambda c: max(0, c.subscriptions - c.subscriptions_shared)),
    ("shared_subscriptions/count", lambda c: c.subscriptions_shared),
    ("retained messages/count", lambda c: c.retained_messages),
    ("messages/received", lambda c: c.packets_in),
    ("messages/sent", lambda c: c.messages_out),
    ("publish/messages/dropped", _dropped),
    ("publish/messages/received", lambda c: c.messages_in),
    ("publish/messages/sent", lambda c: c.messages_out),
    ("bytes/received", lambda c: c.wire_bytes_in),
    ("bytes/sent", lambda c: c.wire_bytes_out),
    ("publish/bytes/received", lambda c: c.bytes_in),
    ("publish/bytes/sent", lambda c: c.bytes_out),
)
MAXIMUM = "clients/maximum"  # the largest clients/total seen (Mosquitto's `client_max`)
# Memory is the cluster's, not a tenant's: only the operator tenant's tree has these.
HEAP_CURRENT = "heap/current"
HEAP_MAXIMUM = "heap/maximum"  # the largest heap/current seen
UPTIME = "uptime"
VERSION = "version"
# Counters whose rate the load averages follow: (topic under PREFIX + "load/", figure).
LOADS: tuple[tuple[str, Figure], ...] = (
    ("messages/received", lambda c: c.packets_in),
    ("messages/sent", lambda c: c.messages_out),
    ("publish/dropped", _dropped),
    ("publish/received", lambda c: c.messages_in),
    ("publish/sent", lambda c: c.messages_out),
    ("bytes/received", lambda c: c.wire_bytes_in),
    ("bytes/sent", lambda c: c.wire_bytes_out),
    # A tenant's socket is known only once its CONNECT authenticated: both count the
    # connections its clients opened.
    ("sockets", lambda c: c.connects),
    ("connections", lambda c: c.connects),
)
PERIODS_S: tuple[tuple[str, float], ...] = (("1min", 60.0), ("5min", 300.0), ("15min", 900.0))


def names() -> list[str]:
    """Every Mosquitto 2.0 `$SYS` name, published or absent (53)."""
    out = [PREFIX + t for t, _ in VALUES]
    out += [PREFIX + MAXIMUM, PREFIX + UPTIME, PREFIX + VERSION]
    out += [PREFIX + HEAP_CURRENT, PREFIX + HEAP_MAXIMUM]
    return out + [f"{PREFIX}load/{t}/{p}" for t, _ in LOADS for p, _ in PERIODS_S]


@dataclass(slots=True)
class SysTree:
    """One tenant's last published values and load averages."""

    version: str
    published: dict[str, bytes] = field(default_factory=dict)  # topic -> last payload
    loads: dict[str, float] = field(default_factory=dict)  # load topic -> average
    counters: dict[str, int] = field(default_factory=dict)  # load source -> last value
    maximum: int = -1
    heap_maximum: int = -1
    last_at: float | None = None

    def update(
        self, c: TenantCounts, now: float, uptime_s: float, memory_bytes: int | None = None
    ) -> list[tuple[str, bytes]]:
        """The (topic, payload) pairs to publish for figures `c` at `now` (seconds);
        `memory_bytes`: the cluster's memory, for the operator tenant's tree only."""
        out: list[tuple[str, bytes]] = []
        first = self.last_at is None
        if first:
            out.append((PREFIX + VERSION, f"starling version {self.version}".encode()))
        for topic, figure in VALUES:
            self._value(out, PREFIX + topic, str(figure(c)).encode())
        # Through `_value`, as the others: a maximum the router did not keep (forgotten in
        # `published`) goes out again next round, though it did not grow.
        self.maximum = max(self.maximum, _total(c))
        self._value(out, PREFIX + MAXIMUM, str(self.maximum).encode())
        if memory_bytes is not None:
            self._heap(out, memory_bytes)
        self._loads(out, c, now)
        if out or c.connections:
            out.append((PREFIX + UPTIME, f"{int(uptime_s)} seconds".encode()))
        self.last_at = now
        return out

    def _value(self, out: list[tuple[str, bytes]], topic: str, payload: bytes) -> None:
        if self.published.get(topic) != payload:
            self.published[topic] = payload
            out.append((topic, payload))

    def _heap(self, out: list[tuple[str, bytes]], memory_bytes: int) -> None:
        self._value(out, PREFIX + HEAP_CURRENT, str(memory_bytes).encode())
        self.heap_maximum = max(self.heap_maximum, memory_bytes)
        self._value(out, PREFIX + HEAP_MAXIMUM, str(self.heap_maximum).encode())

    def _loads(self, out: list[tuple[str, bytes]], c: TenantCounts, now: float) -> None:
        dt = None if self.last_at is None else now - self.last_at
        if dt is not None and dt <= 0:
            return  # no time passed: no rate to fold in
        for name, figure in LOADS:
            value = figure(c)
            grown = max(0, value - self.counters.get(name, value))
            self.counters[name] = value
            for period, span_s in PERIODS_S:
                topic = f"{PREFIX}load/{name}/{period}"
                if dt is None:
                    self.loads[topic] = 0.0
                    out.append((topic, b"0.00"))
                    continue
                rate = grown * 60.0 / dt
                old = self.loads.get(topic, 0.0)
                new = rate + math.exp(-dt / span_s) * (old - rate)
                if abs(new - old) >= 0.01:
                    out.append((topic, f"{new:.2f}".encode()))
                self.loads[topic] = new
