"""Shared subscriptions (`$share/group/filter`): each message to one member cluster-wide.

Each (tenant, group, filter) is a NATS queue group, so NATS picks one node; this module picks
one member on that node. The members of a durable group (one with persistent members) take
its QoS >= 1 messages from the group's queue instead (group_delivery.py). A member that
leaves with unacknowledged messages hands them back to its group (the redelivery subject,
same queue group), and a node whose members are all saturated hands a message back too (at
most MAX_HOPS times), rather than overflowing a member's bounded queue while a member
elsewhere has room.
"""

from __future__ import annotations

import logging
import time

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus.large import Fetcher, Holder
from services.common.envelope import from_envelope
from services.common.tasks import TaskSet
from services.connection.channel import State
from services.connection.conn import Conn
from services.connection.subscriptions import SharedGroup, redelivery_subject
from services.connection.writes import WriteBatcher
from starling.common.v1.message_pb2 import RoutedBatch, RoutedMessage

log = logging.getLogger("starling.connection.shared")

HOPS_HEADER = "Starling-Hops"  # times a shared message was handed back to its group
MAX_HOPS = 3

# (redelivery subject, envelope): where an unacknowledged shared delivery goes back to.
Origin = tuple[str, RoutedMessage]


def credit(conn: Conn) -> int:
    """Deliveries a member can take before it has to queue them."""
    ob = conn.channel.outbound
    return ob.receive_maximum - len(ob.inflight) - len(ob.pending or ())


def pick_member(members: list[Conn], turn: int) -> int:
    """The next member in rotation that has credit, or the one with the most if none has any:
    no member is flooded while another idles, and every member gets a share."""
    n = len(members)
    order = [(turn + k) % n for k in range(n)]
    chosen = next((i for i in order if credit(members[i]) > 0), None)
    return chosen if chosen is not None else max(order, key=lambda i: credit(members[i]))


class SharedDispatch:
    def __init__(
        self,
        nc: Client,
        writes: WriteBatcher,
        tasks: TaskSet,
        holder: Holder | None = None,
        fetcher: Fetcher | None = None,
    ) -> None:
        self._nc = nc  # the connection that holds the queue-group subscriptions
        self._writes = writes
        self._tasks = tasks
        self._holder = holder  # large messages go and come by reference (bus/large.py)
        self._fetcher = fetcher

    async def on_message(self, group: SharedGroup[Conn], msg: Msg) -> None:
        hops = int(msg.headers.get(HOPS_HEADER, "0")) if msg.headers else 0
        data = msg.data if self._fetcher is None else await self._fetcher.resolve(msg)
        if not data:
            return
        for env in RoutedBatch.FromString(data).messages:
            self.deliver(group, env, hops)

    def deliver(self, group: SharedGroup[Conn], env: RoutedMessage, hops: int = 0) -> None:
        """One member gets it, among the connected ones. A durable group's members at
        QoS >= 1 take its QoS >= 1 messages from the group's queue only (group_delivery.py),
        so here only QoS 0 ones."""
        durable = group.durable and env.qos > 0
        members = [
            c
            for c, e in group.members.items()
            if c.channel.state is State.CONNECTED and not (durable and e.qos)
        ]
        if not members:
            return
        group.turn += 1
        conn = members[pick_member(members, group.turn)]
        entry = group.members[conn]
        message = from_envelope(env)
        qos = min(message.qos, entry.qos)
        ob = conn.channel.outbound
        if qos and ob.pending and len(ob.pending) >= ob.max_queued and hops < MAX_HOPS:
            # Every member here is saturated: give it back to the group so NATS can pick
            # another node, instead of overflowing this member's queue (a drop).
            self._tasks.spawn(self.republish([(redelivery_subject(group), env)], hops + 1))
            return
        origin: Origin | None = (redelivery_subject(group), env) if qos else None
        ob.deliver(message, qos, False, entry.sub_ids, time.time(), origin)
        if conn.channel.out:
            self._writes.mark(conn)

    async def redeliver(self, leftovers: list[Origin]) -> None:
        """A member left with unacknowledged messages: hand each to another member of its
        group (published after this node dropped the member, so NATS picks among the rest)."""
        await self.republish(leftovers, 0)
        log.info("shared_redelivered", extra={"messages": len(leftovers)})

    async def republish(self, items: list[Origin], hops: int) -> None:
        """Publish messages on their group's redelivery subject; one member gets each."""
        headers = {HOPS_HEADER: str(hops)} if hops else None
        for subject, env in items:
            batch = RoutedBatch()
            batch.messages.append(env)
            if self._holder is not None:
                await self._holder.publish(self._nc, subject, batch.SerializeToString(), headers)
            else:
                await self._nc.publish(subject, batch.SerializeToString(), headers=headers)
