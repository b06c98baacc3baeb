"""Client events land on the JetStream stream EVENTS as ev.<tenant>.<type>."""

from __future__ import annotations

import asyncio
import uuid

import nats

from services.common.bus.events import decode_events
from starling.common.v1 import event_pb2
from tests.conftest import MeshInfo
from tests.e2e.clients import Paho


async def test_connect_takeover_and_disconnect_events(mesh: MeshInfo) -> None:
    nc = await nats.connect(mesh.nats_url)
    js = nc.jetstream()
    cid = f"ev-{uuid.uuid4().hex[:8]}"

    def session() -> None:
        first = Paho(mesh.node(0), client_id=cid)
        first.connect()
        second = Paho(mesh.node(1), client_id=cid)  # takes the session over
        second.connect()
        first.disconnects.get(timeout=10)
        first.c.loop_stop()
        second.close()

    await asyncio.to_thread(session)
    sub = await js.subscribe("ev.default.>", ordered_consumer=True)
    seen: list[int] = []
    # The stream holds the events of every test of the tenant so far: read all of it.
    for _ in range(100_000):
        try:
            msg = await sub.next_msg(timeout=0.5)
        except nats.errors.TimeoutError:
            break
        # An event alone or a batch of them (CONNECTs answered together).
        seen += [ev.type for ev in decode_events(msg.data) if ev.client_id == cid]
    assert seen.count(event_pb2.EVENT_TYPE_CLIENT_CONNECTED) == 2
    assert event_pb2.EVENT_TYPE_SESSION_TAKEN_OVER in seen
    assert event_pb2.EVENT_TYPE_CLIENT_DISCONNECTED in seen
    await nc.close()
