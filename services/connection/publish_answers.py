"""The answers a client's publishes get once the node is done with them: PUBACK/PUBREC when
the router pipeline stored a QoS>=1 publish (routing.py), a DISCONNECT when it gave up, and
the PUBCOMP (or error PUBREC) of a persistent session's QoS 2 exchange once its release is
written (exactly_once.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from services.common.mqtt.reason import ReasonCode as RC
from services.common.tasks import TaskSet
from services.connection.channel import Action
from services.connection.conn import Conn
from services.connection.exactly_once import ExactlyOnceInbound
from services.connection.writes import WriteBatcher
from services.router.client import RouteResult

_REFUSED: Final = (RouteResult.QUOTA_EXCEEDED, RouteResult.QUEUE_QUOTA_EXCEEDED)


class PublishAnswers:
    def __init__(
        self,
        *,
        tasks: TaskSet,
        writes: WriteBatcher,
        carry_out: Callable[[Conn, list[Action]], None],
    ) -> None:
        self._tasks = tasks
        self._writes = writes
        self._carry_out = carry_out

    def routed(self, conn: Conn | None, pid: int, result: RouteResult) -> None:
        """The router stored a QoS>=1 publish: the publisher gets its PUBACK/PUBREC now
        (0x97 when the tenant's retained-message cap refused its retained part, or a
        subscriber's queue refused it by the tenant's max_queue_depth)."""
        if conn is None or not pid:
            return
        eo = conn.exactly_once  # `Conn` is a Python object: each attribute read once
        if eo is not None:
            eo.routed(pid)
        if conn.closed:
            return
        ch = conn.channel
        code = RC.QUOTA_EXCEEDED if result in _REFUSED else 0
        if code and result is RouteResult.QUEUE_QUOTA_EXCEEDED and ch.level < 5:
            # A subscriber's queue refused it and a 3.1.1 PUBACK cannot say so: close
            # unacknowledged (the client resends it), as for a publish over the rate.
            # (Counted by the queue service, which refused it.)
            why = "a subscriber's queue is at the tenant's max_queue_depth"
            self._carry_out(conn, ch.disconnect(RC.QUOTA_EXCEEDED, why))
            return
        if code and ch.level == 5 and eo is not None and pid in eo.recorded:
            self.release(conn, eo, pid, code)  # the error PUBREC ends the exchange
            return
        ch.publish_routed(pid, code)
        self._writes.mark(conn)

    def gave_up(self, conn: Conn | None) -> None:
        """The router pipeline could not store a publish of `conn`'s: it closes unanswered
        (0x89), and the client resends what it got no ack for."""
        if conn is not None and not conn.closed:
            actions = conn.channel.disconnect(RC.SERVER_BUSY, "persistent routing unavailable")
            self._carry_out(conn, actions)

    def release(self, conn: Conn, eo: ExactlyOnceInbound, pid: int, code: int = -1) -> None:
        """Forget `pid` in the session's stored state, then PUBCOMP (or, with `code`, the
        PUBREC with an error that ends the exchange)."""

        def done() -> None:
            if conn.closed:
                return
            if code < 0:
                conn.channel.qos2_released(pid)
            else:
                conn.channel.publish_routed(pid, code)
            self._writes.mark(conn)

        self._tasks.spawn(eo.release(pid, done), name="qos2-release")
