"""The rules service publishing into the mesh as a connection node does (the `republish`
action, MQTT bridge in), through the shared services/common/bus/publisher.py: on its topic's
NATS subject for online subscribers, and at QoS >= 1 or retained through the router too,
whose answer says it is kept (a message not kept raises, and nothing of the batch goes out).
Messages published here do not go through the rules again (no rule can loop on its own
output)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from nats.aio.client import Client

from services.common.bus.publisher import ServicePublisher
from services.common.message import Message
from services.common.mqtt.properties import EMPTY, Properties
from services.router.client import RouterClient
from services.rules.actions.base import Republished


class MeshRepublisher:
    def __init__(self, nc: Client, router: RouterClient, node_id: str) -> None:
        self._publisher = ServicePublisher(nc, router, node_id)

    async def publish(
        self,
        tenant: str,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        user_properties: tuple[tuple[str, str], ...],
    ) -> None:
        await self.publish_many([Republished(tenant, topic, payload, qos, retain, user_properties)])

    async def publish_many(self, messages: Sequence[Republished]) -> None:
        now = time.time()
        await self._publisher.publish(
            [
                Message(
                    m.tenant,
                    m.topic,
                    m.payload,
                    m.qos,
                    m.retain,
                    properties=Properties(user_property=m.user_properties)
                    if m.user_properties
                    else EMPTY,
                    published_at=now,
                )
                for m in messages
            ]
        )
