"""Client connect/disconnect events as `$SYS` messages inside the client's own tenant:
`$SYS/brokers/<node>/clients/<client id>/connected` and `.../disconnected` (EMQX's names),
QoS 0, not retained, with a JSON payload (docs/metrics.md lists its fields).

They take the path of any publish from this node (`Ingress.publish`, uncounted: they are not
the tenant's traffic): this node's subscribers straight from its trie, other nodes over NATS
on the `$`-topic subject, so `#` never matches them [MQTT-4.7.2-1] and no other tenant can
see them. Cheap when nobody listens: nothing is built for a tenant with no subscription on
this node and none on another node (services/connection/interest.py).

In a client id, `/`, `+`, `#`, `%` and NUL would make another topic or an invalid one: they
are percent-encoded in the topic (`%2F`, `%2B`, `%23`, `%25`, `%00`); the payload carries the
client id as it is.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from services.common.message import Message
from services.common.mqtt.errors import TopicNameInvalidError
from services.common.topics.client_events import client_event_topic
from services.common.topics.rules import validate_topic_name
from services.connection.admission import peer_address
from services.connection.channel import Channel

log = logging.getLogger("starling.connection.sys_events")


def connected_payload(ch: Channel, node_id: str, session_present: bool, ts_ms: int) -> bytes:
    return json.dumps(
        {
            "clientid": ch.client_id,
            "username": ch.identity.partition("/")[2],
            "ipaddress": peer_address(ch.peer),  # "ws:ip" has no port
            "proto_ver": ch.level,
            "session_present": session_present,
            "expiry_interval": ch.session_expiry_s,
            "node": node_id,
            "ts": ts_ms,
        }
    ).encode()


def disconnected_payload(ch: Channel, node_id: str, ts_ms: int) -> bytes:
    return json.dumps(
        {
            "clientid": ch.client_id,
            "username": ch.identity.partition("/")[2],
            # "normal": the client sent DISCONNECT; "closed": anything else (network,
            # keep alive, takeover, protocol error, server shutdown).
            "reason": "normal" if ch.normal_disconnect else "closed",
            "node": node_id,
            "ts": ts_ms,
        }
    ).encode()


class SysEvents:
    def __init__(
        self,
        node_id: str,
        reaches: Callable[[str], bool],
        publish: Callable[[list[Message]], None],
    ) -> None:
        """`reaches(tenant)`: may any subscriber of the tenant get a message published here;
        `publish`: into the mesh, uncounted."""
        self._node_id = node_id
        self._reaches = reaches
        self._publish = publish

    def connected(self, ch: Channel, session_present: bool) -> None:
        if self._reaches(ch.tenant):
            now = time.time()
            payload = connected_payload(ch, self._node_id, session_present, int(now * 1000))
            self._send(ch, "connected", payload, now)

    def disconnected(self, ch: Channel) -> None:
        if self._reaches(ch.tenant):
            now = time.time()
            self._send(
                ch, "disconnected", disconnected_payload(ch, self._node_id, int(now * 1000)), now
            )

    def _send(self, ch: Channel, kind: str, payload: bytes, now: float) -> None:
        topic = client_event_topic(self._node_id, ch.client_id, kind)
        try:
            validate_topic_name(topic)
        except TopicNameInvalidError:  # a client id too long for a topic: no event
            log.debug("sys_event_topic_invalid", extra={"client_id": ch.client_id})
            return
        self._publish([Message(ch.tenant, topic, payload, 0, False, published_at=now)])
