"""Fan-out: delivering one message to the clients of this node whose subscriptions match.

Each client gets a message once, however many of its subscriptions match (merged by
`merge_matches` [MQTT-3.3.4-2]); a persistent session takes QoS >= 1 only from its queue,
never from here, so nothing arrives twice. A connection gets no message published (by its
origin node's clock) before this node took the connection (`Conn.opened_at`): a copy
NATS held back (a route or a node's link cut, then healed) can arrive seconds late, and a
clean session that meanwhile got the message on the old node and moved here (its node
fenced, services/connection/lease.py) would get it twice, at QoS 2 too. No subscription of
that connection existed when it was published, so it was never owed one. This compares
the clocks of two hosts, as message expiry does: a node's clock behind by d drops its
messages published within d after a connection elsewhere opened.

Messages from other nodes arrive in `on_mesh`, one NATS message per batch of one tenant and
topic: the trie is matched once per batch. A message too large for one NATS message arrives
as a reference, fetched before anything after it on that subscription is handled
(services/common/bus/large.py).
"""

from __future__ import annotations

import time

from nats.aio.msg import Msg
from opentelemetry import context as otel_context
from opentelemetry import trace

from services.common.bus.large import Fetcher
from services.common.envelope import from_envelope
from services.common.message import Message
from services.common.telemetry import extract
from services.common.topics.merge import merge_matches
from services.connection.conn import Conn
from services.connection.subscriptions import NodeSubscriptions, SubEntry, should_process
from services.connection.writes import WriteBatcher
from starling.common.v1.message_pb2 import RoutedBatch

tracer = trace.get_tracer("starling.connection")

Matches = list[tuple[Conn, SubEntry]]


def _client_of(conn: Conn) -> str:
    return conn.channel.client_id


class Fanout:
    def __init__(
        self,
        node_id: str,
        subs: NodeSubscriptions[Conn],
        writes: WriteBatcher,
        tracing: bool,
        fetcher: Fetcher | None = None,
    ) -> None:
        self._node_id = node_id
        self._fetcher = fetcher  # large messages arrive as references (bus/large.py)
        self._subs = subs
        self._writes = writes
        self._tracing = tracing

    def deliver(self, message: Message, matches: Matches, publisher: str) -> None:
        """One delivery per matching client of this node."""
        if self._tracing and message.trace_context:
            self._deliver_traced(message, matches, publisher)
        else:
            self._fan(message, matches, publisher)

    def _fan(self, message: Message, matches: Matches, publisher: str) -> None:
        now = time.time()
        if len(matches) == 1:  # the common case, without building a merge table
            conn, e = matches[0]
            if not (e.no_local and conn.channel.client_id == publisher):
                qos = e.qos if e.qos < message.qos else message.qos
                rap = message.retain and e.retain_as_published
                self._deliver_one(conn, message, qos, rap, e.sub_ids, now)
            return
        merged = merge_matches(matches, message.qos, message.retain, publisher, _client_of)
        for conn, (qos, rap, ids) in merged.items():
            self._deliver_one(conn, message, qos, rap, ids, now)

    def _deliver_one(
        self,
        conn: Conn,
        message: Message,
        qos: int,
        retain: bool,
        sub_ids: tuple[int, ...],
        now: float,
    ) -> None:
        if qos and conn.persistent is not None:
            return  # a persistent session takes QoS>=1 only from its queue
        if 0.0 < message.published_at < conn.opened_at:
            return  # published before this connection was opened: a late copy (see above)
        ch = conn.channel
        ch.deliver(message, qos, retain, sub_ids, now)
        if ch.out:
            self._writes.mark(conn)

    def _deliver_traced(self, message: Message, matches: Matches, publisher: str) -> None:
        token = otel_context.attach(extract(dict(message.trace_context)))
        try:
            with tracer.start_as_current_span(
                "mqtt.deliver",
                kind=trace.SpanKind.CONSUMER,
                attributes={
                    "mqtt.topic": message.topic,
                    "starling.node": self._node_id,
                    "starling.tenant": message.tenant,
                    "mqtt.recipients": len(matches),
                },
            ):
                self._fan(message, matches, publisher)
        finally:
            otel_context.detach(token)

    async def on_mesh(self, msg: Msg, received_on: str) -> None:
        """A batch from another node, received on NATS subject `received_on`."""
        data = msg.data if self._fetcher is None else await self._fetcher.resolve(msg)
        if not data:
            return
        envs = RoutedBatch.FromString(data).messages
        if not envs:
            return
        first = envs[0]
        trie = self._subs.tries.get(first.tenant)
        if trie is None:
            return
        # One batch carries one tenant and topic: match once for all of its messages.
        matches = trie.match(first.topic)
        if not matches or (
            len(matches) > 1 and not should_process(received_on, msg.subject, matches)
        ):
            return
        for env in envs:
            self.deliver(from_envelope(env), matches, env.publisher.client_id)
