"""The rules service publishing into the mesh as a connection node does (the `republish`
action, MQTT bridge in): the message goes on its topic's NATS subject for online subscribers,
and at QoS >= 1 or retained through the router too (persistent sessions, the retained store),
whose answer says it is kept. A batch (`publish_many`) is one router call and one NATS message
per topic subject, not a round trip per message. Messages published here do not go through
the rules again (no rule can loop on its own output)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from nats.aio.client import Client

from services.common.envelope import to_envelope
from services.common.message import Message
from services.common.mqtt.properties import EMPTY, Properties
from services.common.topics import topic_to_subject
from services.connection.mesh import MessageIds
from services.router.client import RouterClient, RouteResult
from services.rules.actions.base import Republished
from starling.common.v1.message_pb2 import RoutedBatch, RoutedMessage

_KEPT = {RouteResult.STORED, RouteResult.NO_MATCH}
# Messages of one subject share a NATS message up to this size (well under NATS's 1 MiB
# max_payload); a larger message goes alone, as it did before batching.
_LIVE_BATCH_BYTES = 256 << 10


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
        await self.publish_many([Republished(tenant, topic, payload, qos, retain, user_properties)])

    async def publish_many(self, messages: Sequence[Republished]) -> None:
        now = time.time()
        envs: list[RoutedMessage] = []
        kept: list[RoutedMessage] = []
        for m in messages:
            props = Properties(user_property=m.user_properties) if m.user_properties else EMPTY
            msg = Message(
                m.tenant, m.topic, m.payload, m.qos, m.retain, properties=props, published_at=now
            )
            env = to_envelope(msg, self._node_id, self._ids.next())
            envs.append(env)
            if m.qos or m.retain:
                kept.append(env)
        if kept:
            # Kept first (the router answers once persistent sessions have it), then live.
            for env, result in zip(kept, await self._router.route(kept), strict=True):
                if result not in _KEPT:
                    raise RuntimeError(f"router did not keep {env.topic!r}: {result.name}")
        by_subject: dict[str, list[RoutedMessage]] = {}
        for env in envs:
            by_subject.setdefault(topic_to_subject(env.tenant, env.topic), []).append(env)
        for subject, group in by_subject.items():
            batch = RoutedBatch()
            size = 0
            for env in group:
                n = env.ByteSize()
                if batch.messages and size + n > _LIVE_BATCH_BYTES:
                    await self._nc.publish(subject, batch.SerializeToString())
                    batch, size = RoutedBatch(), 0
                batch.messages.append(env)
                size += n
            await self._nc.publish(subject, batch.SerializeToString())
