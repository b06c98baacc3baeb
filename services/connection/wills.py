"""Will messages: published when a connection ends without a normal DISCONNECT.

A will with a Will Delay Interval goes to the router, which publishes it after
min(delay, session expiry) unless the client connects again first [MQTT-3.1.3-9]; when the
client does connect, `settle` cancels a pending will of a resumed session and publishes it
now if the old session ended (clean start). Only a client id that had a session can have one
pending (the delay never outlasts the session): the session service says so at CONNECT, and
the other CONNECTs skip the router call.

A node that dies publishes nothing: each CONNECT with a will therefore also hands it to the
session service (`Wills.handoff`), which keeps it with the connection's registry entry and
publishes it when it declares the node dead (services/session/wills.py). A connection that
ends while its node lives is released after its will went out, and takes its entry, will
included, with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from services.common.bus.ids import MessageIds
from services.common.envelope import to_envelope
from services.common.message import Message, message_properties
from services.common.mqtt.packets import Will
from services.common.topics import is_sys_topic
from services.connection.channel import Channel
from services.connection.conn import Conn
from services.connection.routing import RoutingPipeline
from services.router.client import RouterClient

log = logging.getLogger("starling.connection.wills")


def _as_message(will: Will, tenant: str, client_id: str, now: float) -> Message:
    """A will published at `now` (its Message Expiry Interval counts from then)."""
    mei = will.properties.message_expiry_interval
    return Message(
        tenant,
        will.topic,
        will.payload,
        will.qos,
        will.retain,
        client_id,
        message_properties(will.properties),
        now + mei if mei is not None else None,
        now,
    )


def will_message(ch: Channel, now: float) -> Message | None:
    """The will of an ended connection as a message, or None (none, or its topic is one no
    client may publish to: `$SYS`, or one the ACL refuses now)."""
    w = ch.will
    if w is None or is_sys_topic(w.topic) or not ch.acl.can_publish(w.topic):
        return None
    return _as_message(w, ch.tenant, ch.client_id, now)


def will_delay_s(ch: Channel) -> int:
    """Seconds to wait: the Will Delay Interval, capped by the session's expiry."""
    if ch.will is None:
        return 0
    expiry = ch.disconnect_expiry_s if ch.disconnect_expiry_s is not None else ch.session_expiry_s
    return min(ch.will.properties.will_delay_interval or 0, expiry)


class Wills:
    def __init__(
        self,
        *,
        node_id: str,
        publish: Callable[[list[Message]], None],
        routing: RoutingPipeline[Conn] | None,
        router: RouterClient | None,
        ids: MessageIds,
        handoff_max_bytes: int = 0,
    ) -> None:
        self._node_id = node_id
        self._publish = publish
        self._routing = routing
        self._router = router
        self._ids = ids
        self._handoff_max = handoff_max_bytes  # will_store_max_bytes

    def handoff(self, will: Will | None, client_id: str) -> bytes:
        """The will as a CONNECT (or a re-assertion) hands it to the session service, which
        publishes it if this node dies: an envelope without tenant or message id (set then);
        b"" for none, or one over `will_store_max_bytes` (only this node publishes it)."""
        if will is None or not self._handoff_max or is_sys_topic(will.topic):
            return b""
        env = to_envelope(_as_message(will, "", client_id, time.time()), self._node_id, "")
        data = env.SerializeToString()
        return data if len(data) <= self._handoff_max else b""

    def connection_ended(self, ch: Channel) -> None:
        if ch.normal_disconnect:
            return
        msg = will_message(ch, time.time())
        if msg is None:
            return
        delay = will_delay_s(ch)
        if delay and self._routing is not None:
            env = to_envelope(msg, self._node_id, self._ids.next())
            env.delay_s = delay
            self._routing.submit(None, 0, env)
            return
        self._publish([msg])

    async def settle(self, tenant: str, client_id: str, resumed: bool) -> None:
        """A client connected: a delayed will of its previous connection is cancelled if the
        session was resumed, published now if the old session ended."""
        if self._router is None:
            return
        try:
            await self._router.settle_will(tenant, client_id, publish_now=not resumed)
        except Exception as exc:
            log.warning("settle_will_failed", extra={"error": type(exc).__name__})
