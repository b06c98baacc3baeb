"""The rules service publishing into the mesh as a connection node does (the `republish`
action, MQTT bridge in): the message goes on its topic's NATS subject for online subscribers,
and at QoS >= 1 or retained through the router too (persistent sessions, the retained store),
whose answer says it is kept. Messages published here do not go through the rules again
(no rule can loop on its own output)."""

from __future__ import annotations

import time

from nats.aio.client import Client

from services.common.envelope import to_envelope
from services.common.message import Message
from services.common.mqtt.properties import EMPTY, Properties
from services.common.topics import topic_to_subject
from services.connection.mesh import MessageIds
from services.router.client import RouterClient, RouteResult
from starling.common.v1.message_pb2 import RoutedBatch

_KEPT = {RouteResult.STORED, RouteResult.NO_MATCH}


class MeshRepublisher:
    def __init__(self, nc: Client, router: RouterClient, node_id: str) -> None:
        self._nc = nc
        self._router = router
        self._node_id = node_id
        self._ids = MessageIds(node_id, time.time_ns())

    async def publish(
        self,
        tenant: str,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        user_properties: tuple[tuple[str, str], ...],
    ) -> None:
        props = Properties(user_property=tuple(user_properties)) if user_properties else EMPTY
        msg = Message(
            tenant, topic, payload, qos, retain, properties=props, published_at=time.time()
        )
        env = to_envelope(msg, self._node_id, self._ids.next())
        if qos or retain:
            # Kept first (the router answers once persistent sessions have it), then live.
            (result,) = await self._router.route([env])
            if result not in _KEPT:
                raise RuntimeError(f"router did not keep the message: {result.name}")
        await self._nc.publish(
            topic_to_subject(tenant, topic), RoutedBatch(messages=[env]).SerializeToString()
        )
