"""The node's lease on its clients: whether it may still hold them, and its fence when not.

Owns the lease state (the send time of the latest confirmed heartbeat, fenced or not) and
what fencing does to the node. The session service releases a node's clients when the
node has been silent for `node_timeout_s` (T, 10 s; services/session/liveness.py); the node
never hears that decision, so it must let go first. Each heartbeat (`hb.node.<id>`, every
second, services/connection/sweeper.py) is a request. Every session instance that hears
it records it in Redis (the Redis server's time) and answers: "ok" or "new" once the write
succeeded, "unwritten" when it failed or took over 3 s (Redis away or slow), nothing while
the record carries a release mark. The node fences itself at the first sweeper tick (every
0.5 s) at which no heartbeat sent in the last `self_fence_s` (F, 5 s, its monotonic clock)
has been answered. An unwritten answer renews a lease that still runs when it arrives; it
neither ends a fence nor renews an expired lease: only a written answer does. So a Redis
outage fences no node (every instance answers unwritten; F must exceed those 3 s) and a
node that is fenced (being released, or cut off) stays fenced until Redis records it again.

Why a node drops its clients before anyone may release them. An instance R claims the
release of node N at Redis time c only if (a) R has not heard N for T, (b) N's record is
older than c - T (read and marked in one script), (c) R's liveness calls to Redis have all
succeeded for the last T, each within its limit (3 s for a heartbeat's write, 1 s for the
others, which it makes every second), with no gap over 2.5 s between two successes; a
(re)started R has no streak; a claim that runs in Redis over 2 s after R's previous call
is void (one sent before an outage and run after it marks nothing). Suppose N is not
fenced at c: it got, before c, an answer to a heartbeat sent at t >= c - F - 0.5 (the
tick), heard by an instance S at h, t <= h <= c.
1. Written: the write preceded the claim (a later one finds the mark: no answer), so the
   record is >= t > c - T at the claim (F + 0.5 < T): (b) fails.
2. Unwritten, and R heard N after c - T (R = S, or any instance on the NATS that carries
   N's heartbeats: every instance gets every heartbeat): (a) fails.
3. Unwritten, R did not hear N (a NATS split with R on the other side, or R's NATS link
   down), and S's write failed because Redis failed everyone over [a, b], h in it, b < c
   (the claim ran). Refusing (down, restarting): R's calls in it failed. Unreachable (its
   host cut off) or stalled: S's write got no answer for 3 s, so the outage lasted 3 s and
   no call of R's could succeed across it (its limit is at most 3 s): a gap over 2.5 s,
   or a failure. Either way R's streak restarts after b >= t, and (c) puts the claim after
   t + T = t + 10 s, when N has fenced (by t + 5.5 s) and shed its clients (at most 1 s of
   owed acks): 3.5 s of margin, as in case 1. A refusal R's calls did not meet (under
   about a second) fails only the writes made during it: N's next heartbeat is written
   (case 1), or there is none and N fences by t + 5.5 s while the record, written by
   t - 1, lets a claim come only after t + 9 s.
An unwritten answer does not end a fence, so a node being released (fenced when its
release was claimed, as above) stays fenced until the release is over and Redis writes its
record again; then it re-asserts. Holes, both needing R not to hear N (as in 3) while the
Redis fault spares R: (H1) S alone loses Redis (its host cut off from Redis, its
connection pool exhausted, its event loop stalled past the 3 s limit) while R keeps it: N
lives on S's unwritten answers while R releases it after T (before unwritten answers this
could not happen); (H2) Redis refusing for under a second, again and again, at every
heartbeat of N and never when R calls, for T. Not covered at all: the node process itself
paused (GC, SIGSTOP, a VM freeze) for longer than the margin. The sweeper checks the
lease at every tick from the last confirmed send time, so a node that resumes from a long
pause fences on its next tick (0.5 s at most), and CONNECT admission reads `fenced`;
callbacks that were ready when the pause ended (a delivery from NATS) may run before that
tick.

Fenced: every client is told DISCONNECT 0x9C (Use another server; MQTT 3.1.1: closed)
after the acks it is owed are written (at most `ack_wait_s`), a CONNECT is refused at once
with CONNACK 0x88 (Server unavailable; 3.1.1: 3) and a reason string naming the cause,
`on_change(True)` turns gRPC health NOT_SERVING (services/connection/main.py), and
`node_fenced` is logged. When written answers resume the node unfences (`node_unfenced`,
health SERVING) and re-asserts what it holds in the registry (`ctl.nodes.reassert`'s
path, services/connection/session_link.py): a client another node took meanwhile is
closed here with 0x8E. It re-asserts too when an answer says its record was new (the
session service released it, or Redis lost it) while it was not fenced.

The lease is armed by the first answer: a node whose heartbeats were never answered (a
session service from before this, during a rolling upgrade) never fences. `self_fence_s`
0 turns the fence off. The price of the fence: a node cannot tell that no session instance
runs from its own isolation or from a NATS split that leaves every instance on the other
side (where they will release it after T), so a stop of every session instance longer
than F fences every node (run two instances or more; docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry import metrics

from services.common.bus import subjects
from services.common.connect import ConnectOutcome
from services.common.mqtt.reason import ReasonCode as RC

if TYPE_CHECKING:
    from services.connection.conn import Conn
    from services.connection.node import Node

log = logging.getLogger("starling.connection.lease")

REASON = "node lost the session service (fenced)"
# An answer's payload when the session service had no record of this node (a release, or
# Redis lost it): the node re-asserts its clients.
NEW_RECORD = b"new"
# An answer's payload when the session instance could not record the heartbeat (Redis away
# or slow): it renews a running lease, never ends a fence (services/session/liveness.py).
UNWRITTEN = b"unwritten"


class NodeLease:
    def __init__(
        self,
        node: Node,
        nc: Any,
        fence_after_s: float,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._node = node
        self._nc = nc
        self._fence_after_s = fence_after_s
        self._on_change = on_change
        self._clock = clock
        self.confirmed_at: float | None = None  # send time of the latest answered heartbeat
        self.fenced = False  # read on CONNECT admission: a boolean, nothing more
        self.fences = 0  # times this node fenced itself (a metric)
        self._in_flight = 0
        self._shedding: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self._fence_after_s > 0

    async def beat(self) -> None:
        """Send one heartbeat and wait (at most `fence_after_s`) for its first answer."""
        sent = self._clock()
        subject = subjects.node_heartbeat(self._node.node_id)
        payload = self._node.node_id.encode()
        if self._in_flight > max(2, int(self._fence_after_s) * 2):
            return  # answers are not coming: no pile of waiting requests
        self._in_flight += 1
        try:
            reply = await self._nc.request(subject, payload, timeout=self._fence_after_s or 2.0)
        except Exception:  # no answer (timeout, no responders, NATS away): the lease ages
            return
        finally:
            self._in_flight -= 1
        self.confirmed(sent, reply.data)

    def confirmed(self, sent_at: float, answer: bytes = b"ok") -> None:
        """A heartbeat sent at `sent_at` was answered with `answer`."""
        if answer == UNWRITTEN and (self.fenced or self._expired(self._clock())):
            return  # only a written answer restores a lost lease (a release may be running)
        new_record = answer == NEW_RECORD
        if self.confirmed_at is None or sent_at > self.confirmed_at:
            self.confirmed_at = sent_at
        if self.fenced and not self._expired(self._clock()):
            self._unfence()
        elif new_record and self._node.registry.held():
            log.warning("node_lease_record_new", extra={"node": self._node.node_id})
            self._reassert("lease record new")

    def age_s(self) -> float:
        """Seconds since the latest answered heartbeat was sent (-1: none answered yet)."""
        at = self.confirmed_at
        return -1.0 if at is None else self._clock() - at

    def _expired(self, now: float) -> bool:
        at = self.confirmed_at
        return self.enabled and at is not None and now - at > self._fence_after_s

    def check(self, now: float) -> None:
        """At every sweeper tick: fence once the lease ran out; while fenced, close any
        client that still got through (a CONNECT authenticated as the fence began)."""
        if not self.fenced:
            if self._expired(now):
                self._fence(now)
            return
        if self._shedding is None or self._shedding.done():
            stray = [c for c in self._node.registry.conns if c.registered and not c.closed]
            for conn in stray:
                self._disconnect(conn)

    def refusal(self) -> ConnectOutcome:
        """The CONNACK a CONNECT gets while fenced."""
        return ConnectOutcome(reason_code=RC.SERVER_UNAVAILABLE, reason_string=REASON)

    def _fence(self, now: float) -> None:
        self.fenced = True
        self.fences += 1
        silent = now - self.confirmed_at if self.confirmed_at is not None else 0.0
        log.error(
            "node_fenced",
            extra={
                "node": self._node.node_id,
                "unconfirmed_s": round(silent, 1),
                "connections": len(self._node.registry),
            },
        )
        if self._on_change is not None:
            self._on_change(True)
        self._shedding = asyncio.get_running_loop().create_task(
            self._shed(list(self._node.registry.conns)), name="node-fence-shed"
        )

    def _unfence(self) -> None:
        self.fenced = False
        log.warning("node_unfenced", extra={"node": self._node.node_id})
        if self._on_change is not None:
            self._on_change(False)
        self._reassert("unfenced")

    def _reassert(self, why: str) -> None:
        self._node.tasks.spawn(self._node.sessions.reassert(why), name="lease-reassert")

    async def _shed(self, conns: list[Conn]) -> None:
        """Stop reading every client, wait (at most the node's `ack_wait_s`, 1 s at most)
        for the acks they are owed, then DISCONNECT 0x9C."""
        owing = []
        for conn in conns:
            if conn.closed:
                continue
            if not conn.registered:
                self._disconnect(conn)  # still in its handshake
                continue
            conn.channel.stop_reading()
            if conn.channel.owes_acks:
                owing.append(conn)
            else:
                self._disconnect(conn)
        deadline = self._clock() + min(self._node.ack_wait_s, 1.0)
        while owing and self._clock() < deadline:
            await asyncio.sleep(0.01)
            owing = [c for c in owing if not c.closed and c.channel.owes_acks]
        for conn in conns:
            self._disconnect(conn)

    def _disconnect(self, conn: Conn) -> None:
        if conn.closed:
            return
        # Before its CONNACK a client gets CONNACK 0x9C (3.1.1: 3), as from a draining node.
        actions = conn.channel.disconnect(RC.USE_ANOTHER_SERVER, REASON)
        if actions:
            self._node.carry_out(conn, actions)
        else:
            conn.sink.close()
            self._node.cleanup(conn)


def register_lease_metrics(lease: NodeLease) -> None:
    """`starling_node_fenced` (1 while fenced), `starling_node_fences` (times fenced) and
    `starling_node_lease_age_seconds` (how near the next fence is)."""
    meter = metrics.get_meter("starling.connection")
    meter.create_observable_gauge(
        "starling_node_fenced",
        [lambda _o: [metrics.Observation(int(lease.fenced))]],
        description="1 while the node is fenced (its heartbeats unanswered, lease.py)",
    )
    meter.create_observable_counter(
        "starling_node_fences",
        [lambda _o: [metrics.Observation(lease.fences)]],
        description="Times the node fenced itself",
    )
    meter.create_observable_gauge(
        "starling_node_lease_age_seconds",
        [lambda _o: [metrics.Observation(lease.age_s())]],
        description="Seconds since the node's latest answered heartbeat was sent (-1: none "
        "yet); the node fences at self_fence_s",
    )
