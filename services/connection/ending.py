"""How a connection ends on a node: `Endings.close` carries out a channel's `Close` (the
socket closes, at once or once a persistent session's queue reader detached) and
`Endings.cleanup`, exactly once per connection, forgets its subscriptions, hands its
unacknowledged shared deliveries to other members, publishes its will and releases its
session (once its QoS 2 records are written and its delayed will is at the router:
settling.py)."""

from __future__ import annotations

import asyncio
import time

from services.common.tasks import TaskSet
from services.connection.admission import PerAddress
from services.connection.conn import Conn
from services.connection.flow import FlowControl
from services.connection.ordered import OrderedOps
from services.connection.registry import Registry
from services.connection.session_link import SessionLink
from services.connection.settling import SettlingConnections
from services.connection.shared import Origin, SharedDispatch
from services.connection.stats import NodeStats
from services.connection.subscribing import Subscriber
from services.connection.sweeper import Sweeper
from services.connection.sys_events import SysEvents
from services.connection.wills import Wills
from services.connection.writes import WriteBatcher


class Endings:
    def __init__(
        self,
        *,
        registry: Registry,
        sweeper: Sweeper,
        per_address: PerAddress,
        writes: WriteBatcher,
        flow: FlowControl,
        subscriber: Subscriber,
        shared: SharedDispatch,
        ops: OrderedOps,
        tasks: TaskSet,
        stats: NodeStats,
        wills: Wills,
        sys_events: SysEvents,
        sessions: SessionLink,
        settling: SettlingConnections,
        settle_s: float,
    ) -> None:
        """`settle_s`: the longest a socket waits for its queue reader to detach."""
        self._registry = registry
        self._sweeper = sweeper
        self._per_address = per_address
        self._writes = writes
        self._flow = flow
        self._subscriber = subscriber
        self._shared = shared
        self._ops = ops
        self._tasks = tasks
        self._stats = stats
        self._wills = wills
        self._sys_events = sys_events
        self._sessions = sessions
        self._settling = settling
        self._settle_s = settle_s

    def close(self, conn: Conn) -> None:
        """The channel closed: write what it has, end the connection, close the socket."""
        conn.flush()
        detaching = self.cleanup(conn)
        if detaching is None:
            conn.sink.close()
        else:
            # The socket closes once the queue reader detached (bounded): a message
            # published after the client saw its connection end must reach its next
            # connection as a first attempt (DUP=0), not be pushed to this one.
            self._tasks.spawn(self._close_after(conn, detaching), name="close-after")

    def cleanup(self, conn: Conn) -> asyncio.Task[None] | None:
        """Exactly once per connection: forget its subscriptions, publish its will, release
        its session. Returns the detach of its queue reader (a persistent session), if any."""
        if conn.closed:
            return None
        conn.closed = True
        self._registry.closed(conn, time.monotonic())
        self._sweeper.forget(conn)
        self._per_address.closed(conn.channel.peer)
        self._writes.discard(conn)
        self._flow.forget(conn)
        ch = conn.channel
        ch.connection_lost()
        leftovers: list[Origin] = ch.outbound.unacked_shared()  # type: ignore[assignment]
        if ch.subscriptions:
            self._subscriber.unsubscribe(conn, tuple(ch.subscriptions))
        if leftovers:
            self._ops.put(lambda: self._shared.redeliver(leftovers))
        closing = None
        if conn.persistent is not None:
            closing = self._tasks.spawn(conn.persistent.close(), name="persistent-close")
        if conn.exactly_once is not None:
            self._tasks.spawn(conn.exactly_once.ended(), name="qos2-ended")
        if not conn.registered:
            return closing
        self._stats.connection_ended(conn)
        key = (ch.tenant, ch.client_id)
        will = self._wills.connection_ended(ch)
        if will is not None:  # released once the router has it (before any kick reply)
            self._settling.hold_will(key, will)
        self._sys_events.disconnected(ch)
        eo = conn.exactly_once
        if eo is not None and eo.busy:
            # Released only once its records are written: the next connection resumes a
            # session that knows every QoS 2 id this one took.
            self._settling.hold(key, eo)  # before any kick reply
        elif closing is None and will is None:
            self._sessions.connection_ended(conn)
            return None
        release = self._settling.release_when_settled(
            key, eo, closing, lambda: self._sessions.connection_ended(conn)
        )
        self._tasks.spawn(release, name="release-wait")
        return closing

    async def _close_after(self, conn: Conn, detaching: asyncio.Task[None]) -> None:
        try:
            await asyncio.wait((detaching,), timeout=self._settle_s)
        finally:
            conn.sink.close()

    @staticmethod
    async def answer_owed(conns: list[Conn], timeout_s: float) -> None:
        """Before closing `conns`: stop reading them, then wait (at most `timeout_s`) until
        the acks they are owed are written, so that no exchange the node finished is left
        unanswered (a PUBREL whose release was written, answered PUBCOMP 0x92 on the next
        node). Polled: it runs once, on the way out."""
        owing = []
        for conn in conns:
            if not conn.closed:
                conn.channel.stop_reading()
                if conn.channel.owes_acks:
                    owing.append(conn)
        deadline = time.monotonic() + timeout_s
        while owing and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
            owing = [c for c in owing if not c.closed and c.channel.owes_acks]
