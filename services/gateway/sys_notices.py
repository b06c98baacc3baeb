"""A CoAP client's connect and disconnect as `$SYS` messages inside its own tenant, as a
node announces its MQTT clients (services/connection/sys_events.py, EMQX's names):
`$SYS/brokers/<gateway node id>/clients/<client id>/connected` and `.../disconnected`, QoS 0,
not retained, a JSON payload of the same fields (`proto_ver` 5: the gateway registers its
clients as MQTT 5 ones; `protocol` "coap" in addition). Published through the mesh
(ServicePublisher), best effort: a notice that cannot go out is logged, never retried.
The topic and its percent-encoding of the ids: services/common/topics/client_events.py, as
the node's.
"""

from __future__ import annotations

import json
import logging
import time

from services.common.bus.publisher import ServicePublisher
from services.common.message import Message
from services.common.tasks import TaskSet
from services.common.topics.client_events import client_event_topic

log = logging.getLogger("starling.gateway.sys_notices")


class SysNotices:
    def __init__(self, *, publisher: ServicePublisher, node_id: str) -> None:
        self._publisher = publisher
        self._node_id = node_id
        self._tasks = TaskSet()

    def connected(self, tenant: str, client_id: str, username: str, address: str) -> None:
        self._send(
            tenant,
            client_id,
            "connected",
            {
                "clientid": client_id,
                "username": username,
                "ipaddress": address,
                "proto_ver": 5,
                "protocol": "coap",
                "session_present": False,
                "expiry_interval": 0,
            },
        )

    def disconnected(self, tenant: str, client_id: str, username: str, normal: bool) -> None:
        reason = "normal" if normal else "closed"
        fields = {"clientid": client_id, "username": username, "reason": reason}
        self._send(tenant, client_id, "disconnected", fields)

    def _send(self, tenant: str, client_id: str, kind: str, fields: dict[str, object]) -> None:
        now = time.time()
        payload = json.dumps({**fields, "node": self._node_id, "ts": int(now * 1000)}).encode()
        topic = client_event_topic(self._node_id, client_id, kind)
        msg = Message(tenant, topic, payload, 0, False, published_at=now)
        self._tasks.spawn(self._publish(msg), "gateway-sys-notice")

    async def _publish(self, msg: Message) -> None:
        try:
            await self._publisher.publish([msg])
        except Exception as exc:
            log.warning("sys_notice_failed", extra={"error": type(exc).__name__})

    async def close(self) -> None:
        await self._tasks.wait(1.0)
        await self._tasks.cancel()
