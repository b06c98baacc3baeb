"""A client's publishes entering the mesh: the node's hot path.

For each message, in order: a `$delayed/` publish goes only to the router (it publishes when
due); every other one joins the NATS batch of its subject (for other nodes), is delivered to
this node's own subscribers straight from the trie (one hop: the NATS connection is
`no_echo`, so it never comes back here), and, at QoS >= 1 or retained, goes to the router,
whose answer releases the publisher's PUBACK/PUBREC (`RoutingPipeline`). A QoS 0 message
some rule of its tenant reads goes to the RULES stream without waiting (`rules`; QoS >= 1 ones
go there from the routing pipeline, services/connection/rules_tap.py).
"""

from __future__ import annotations

from typing import Final, cast

from opentelemetry import trace

from services.common.bus.ids import MessageIds
from services.common.envelope import fill_shared, shared_part, to_envelope
from services.common.message import Message
from services.common.message_size import message_bytes
from services.common.mqtt.properties import EMPTY
from services.common.telemetry import TENANT_ATTRIBUTE, inject
from services.common.topics import topic_to_subject
from services.common.topics.delayed import DELAYED_PREFIX
from services.connection.conn import Conn
from services.connection.fanout import Fanout, Matches
from services.connection.flow import FlowControl
from services.connection.interest import MeshInterest
from services.connection.mesh import MeshPublisher
from services.connection.routing import RoutingPipeline
from services.connection.stats import NodeStats, Tally
from services.connection.subscriptions import NodeSubscriptions
from services.rules.client import RuleFeed
from starling.common.v1.message_pb2 import RoutedMessage

tracer = trace.get_tracer("starling.connection")
_DELAYED: Final = DELAYED_PREFIX  # a C static when compiled, not a module dict lookup

# What an envelope (services/common/envelope.py) adds to its strings' bytes when it has no
# properties and no trace context: a tag and a length (at most 5 bytes) per string or bytes
# field, the qos, retain and publish time varints, the publisher's message header.
_ENVELOPE_FRAMING_BYTES: Final = 64


def envelope_size_bound(msg: Message, body: int, node_id: str, message_id: str) -> int:
    """At least the encoded size of `msg`'s envelope without properties or trace context
    (`body`: its `message_bytes`): the routing pipeline's batch budget, without
    `ByteSize()`, which encodes the message to count. A character is at most 4 UTF-8 bytes."""
    names = len(msg.tenant) + len(msg.publisher) + len(node_id) + len(message_id)
    return body + 4 * names + _ENVELOPE_FRAMING_BYTES


class Ingress:
    def __init__(
        self,
        *,
        node_id: str,
        subs: NodeSubscriptions[Conn],
        mesh: MeshPublisher,
        fanout: Fanout,
        flow: FlowControl,
        stats: NodeStats,
        routing: RoutingPipeline[Conn] | None,
        ids: MessageIds,
        tracing: bool,
        interest: MeshInterest | None = None,
        rules: RuleFeed | None = None,
    ) -> None:
        self._node_id = node_id
        self._subs = subs
        self._mesh = mesh
        self._fanout = fanout
        self._flow = flow
        self._stats = stats
        self._routing = routing
        self._ids = ids
        self._tracing = tracing
        self._interest = interest
        self._rules = rules
        # The envelope fields of the last publisher's messages (`shared_part`): its tenant,
        # its client id, and their encoding.
        self._shared_tenant = self._shared_client = ""
        self._shared = shared_part("", "", node_id)

    def reaches(self, tenant: str) -> bool:
        """May a message of `tenant` published here reach anyone: a subscriber on this node,
        or another node that listens to the tenant (True when unsure)."""
        if tenant in self._subs.tries:
            return True
        return self._interest is None or self._interest.wanted_elsewhere(tenant)

    def publish(self, msgs: list[Message], conn: Conn | None = None, counted: bool = True) -> None:
        """Messages of one tenant, in the order the client sent them (`conn` None: a will;
        `counted` False: the node's own `$SYS` events, not the tenant's traffic)."""
        tenant = msgs[0].tenant
        stats = self._stats
        if counted:
            stats.topics_of(tenant).sample(msgs)
        # No other node listens to this tenant: no NATS batch (most of the per-message cost).
        mesh = self._interest is None or self._interest.wanted_elsewhere(tenant)
        sent, q1, q2, nbytes = self._each(msgs, conn, tenant, mesh)
        if counted:
            self._count(stats.for_tenant(tenant), len(msgs), q1, q2, nbytes)
        if sent:
            self._mesh.added(sent)
        elif not mesh and self._interest is not None:
            self._interest.skipped += len(msgs)
        self._flow.published(len(msgs), conn)

    def _each(
        self, msgs: list[Message], conn: Conn | None, tenant: str, mesh: bool
    ) -> tuple[int, int, int, int]:
        """Each message to the router, the NATS batch (`mesh`), the rules and this node's
        subscribers; (messages put in NATS batches, QoS 1 ones, QoS 2 ones, bytes)."""
        node_id = self._node_id
        routing = self._routing
        trie = self._subs.tries.get(tenant)
        rules = self._rules
        rule_filters = rules.filters_of(tenant) if rules is not None else None
        last_topic, matches = None, cast(Matches, [])
        sent = q1 = q2 = nbytes = 0  # the batch's counts (`_count`), inline: per message
        for msg in msgs:
            size = message_bytes(msg.topic, msg.payload)
            nbytes += size
            q1 += msg.qos == 1
            q2 += msg.qos == 2
            if msg.topic.startswith(_DELAYED) and routing is not None:
                mid = msg.message_id or self._ids.next()
                routing.submit(conn, msg.packet_id, to_envelope(msg, node_id, mid))
                continue
            env, bound = self._envelope(msg, tenant, mesh, size)
            sent += mesh
            if self._tracing and env is not None:
                msg = self._start_trace(msg, env)
            if rule_filters is not None and not msg.qos and rule_filters.match(msg.topic):
                assert rules is not None  # rule_filters came from it
                rules.offer(env or to_envelope(msg, node_id, self._ids.next()))
            if trie is not None:
                if msg.topic != last_topic:
                    last_topic = msg.topic
                    matches = trie.match(msg.topic)
                if matches:
                    self._fanout.deliver(msg, matches, msg.publisher)
            if (msg.qos or msg.retain) and routing is not None and env is not None:
                # Persistent sessions and retained messages: stored before the publisher is
                # acknowledged.
                stamp = (tenant, int(msg.published_at * 1000))  # as the envelope has it
                routing.submit(conn, msg.packet_id, env, bound, stamp)
        return sent, q1, q2, nbytes

    def _envelope(
        self, msg: Message, tenant: str, mesh: bool, body: int
    ) -> tuple[RoutedMessage | None, int]:
        """`msg`'s envelope, in the NATS batch of its subject when `mesh`, and at least its
        encoded size (`_size_bound`); (None, 0) when neither the mesh, the router nor a
        trace needs one (QoS 0, not retained). `body`: its `message_bytes`."""
        if not (mesh or msg.qos or msg.retain or self._tracing):
            return None, 0
        # A persistent session's QoS 2 publish comes with the id it was recorded under.
        mid = msg.message_id or self._ids.next()
        if mesh:
            subject = topic_to_subject(tenant, msg.topic)
            batch = self._mesh.batch_for(subject, len(msg.payload) + len(msg.topic))
            env = batch.messages.add()  # filled in place: no message to copy into the batch
        else:
            env = RoutedMessage()
        if tenant != self._shared_tenant or msg.publisher != self._shared_client:
            self._shared_tenant, self._shared_client = tenant, msg.publisher
            self._shared = shared_part(tenant, msg.publisher, self._node_id)
        fill_shared(env, self._shared, msg, mid)
        return env, self._size_bound(msg, body, mid)

    def _size_bound(self, msg: Message, body: int, message_id: str) -> int:
        """`envelope_size_bound` of `msg`'s envelope; -1 (the pipeline asks protobuf) when it
        has properties or a trace context, which the bound does not count."""
        if self._tracing or msg.properties is not EMPTY or msg.expires_at is not None:
            return -1
        return envelope_size_bound(msg, body, self._node_id, message_id)

    @staticmethod
    def _count(tally: Tally, n: int, q1: int, q2: int, nbytes: int) -> None:
        """A batch of `n` messages (`q1` at QoS 1, `q2` at QoS 2; `nbytes`: their sizes as
        services/common/message_size.py defines them, the figure the bytes_in_per_s quota
        limits)."""
        tally.messages_in += n
        tally.in_q1 += q1
        tally.in_q2 += q2
        tally.bytes_in += nbytes

    def _start_trace(self, msg: Message, env: RoutedMessage) -> Message:
        """Open the publish span; its context travels in the envelope and the message."""
        with tracer.start_as_current_span(
            "mqtt.publish",
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "mqtt.topic": msg.topic,
                "starling.node": self._node_id,
                TENANT_ATTRIBUTE: msg.tenant,  # the sampler decides by tenant
                "mqtt.qos": msg.qos,
            },
        ) as span:
            # Not sampled: no context at all, so no later process opens a span for it.
            carrier = inject() if span.is_recording() else None
        if not carrier:
            return msg
        env.trace_context.update(carrier)
        return msg._replace(trace_context=tuple(carrier.items()))
