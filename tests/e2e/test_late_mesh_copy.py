"""A transient copy that reaches a node late (NATS held it back: a route or a node's link cut,
then healed) after its subscriber moved there from the node it got the message on: the
partition suite's NATS split found a clean QoS 2 subscriber getting ~270 messages twice this
way (its node fenced, it reconnected to the other node, and the held-back copies arrived
after the heal). The late copy is replayed here by hand on the two-node mesh: the same NATS
message node 0 put on the mesh, published again once the subscriber is on node 1."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats
from nats.aio.msg import Msg

from services.common.bus.flushing import flushed
from services.common.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
)
from services.common.topics import topic_to_subject
from starling.common.v1.message_pb2 import RoutedBatch
from tests.conftest import MeshInfo
from tests.e2e.clients import Raw
from tests.poll import eventually


def _clean(port: int, cid: str, topic: str) -> Raw:
    """A clean MQTT 5 session on `port` subscribed to `topic` at QoS 2."""
    raw = Raw(port, 5)
    ack = raw.connect(Connect(cid, 5, clean_start=True))
    assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
    raw.send(Subscribe(1, (Subscription(topic, 2),)))
    assert isinstance(raw.recv(), SubAck)
    return raw


def _publish_q2(raw: Raw, topic: str, payload: bytes, pid: int) -> None:
    raw.send(Publish(topic, payload, 2, False, False, pid))
    assert raw.recv() == PubRec(pid)
    raw.send(PubRel(pid))
    assert raw.recv() == PubComp(pid)


def _take_until(raw: Raw, last: bytes) -> list[bytes]:
    """The payloads of the QoS 2 deliveries up to and including `last`, each completed
    (PUBREC, PUBREL, PUBCOMP)."""
    got: list[bytes] = []
    releasing: set[int] = set()
    while last not in got or releasing:
        p = raw.recv()
        if isinstance(p, Publish):
            assert p.qos == 2, p
            got.append(p.payload)
            releasing.add(p.packet_id or 0)
            raw.send(PubRec(p.packet_id or 0))
        else:
            assert isinstance(p, PubRel) and p.packet_id in releasing, p
            releasing.discard(p.packet_id)
            raw.send(PubComp(p.packet_id))
    return got


async def test_a_late_mesh_copy_does_not_reach_a_subscriber_that_moved(mesh: MeshInfo) -> None:
    topic = f"late/{uuid.uuid4().hex[:8]}"
    subject = topic_to_subject("default", topic)
    nc = await nats.connect(mesh.nats_url)  # the operator: announces no interest
    carried: list[bytes] = []

    async def on_msg(msg: Msg) -> None:
        carried.append(msg.data)

    await nc.subscribe(subject, cb=on_msg)
    await flushed(nc)
    # A subscriber on node 1, so node 0 puts the topic's messages on NATS.
    witness = _clean(mesh.node(1), f"late-w-{uuid.uuid4().hex[:6]}", topic)
    mover_id = f"late-m-{uuid.uuid4().hex[:6]}"
    mover = _clean(mesh.node(0), mover_id, topic)
    pub = Raw(mesh.node(0), 5)
    assert isinstance(pub.connect(Connect(f"late-p-{uuid.uuid4().hex[:6]}", 5)), ConnAck)
    try:
        _publish_q2(pub, topic, b"first", 1)
        assert _take_until(mover, b"first") == [b"first"]  # on node 0, its own fan-out
        await eventually(lambda: carried, 10.0, "node 0's copy of the message on NATS")
        late = carried[0]
        assert [m.payload for m in RoutedBatch.FromString(late).messages] == [b"first"]
        # The mover's node goes away (say, fenced): it reconnects, clean, to node 1.
        mover.send(Disconnect())
        mover.close()
        mover = _clean(mesh.node(1), mover_id, topic)
        # The copy NATS held back arrives now, then a message published after the move,
        # both from one NATS connection, so node 1 handles them in that order.
        fresh = RoutedBatch.FromString(late)
        fresh.messages[0].payload = b"second"
        fresh.messages[0].message_id = f"late-{uuid.uuid4().hex}"
        fresh.messages[0].published_at_ms = int(time.time() * 1000)
        await nc.publish(subject, late)
        await nc.publish(subject, fresh.SerializeToString())
        await flushed(nc)
        got = await asyncio.to_thread(_take_until, mover, b"second")
        assert got == [b"second"], "the late copy of a QoS 2 message it had got came again"
    finally:
        for c in (witness, mover, pub):
            c.close()
        await nc.close()
