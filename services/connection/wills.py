"""Will messages: published when a connection ends without a normal DISCONNECT.

A will with a Will Delay Interval goes to the router, which publishes it after
min(delay, session expiry) unless the client connects again first [MQTT-3.1.3-9]; when the
client does connect, `settle` cancels a pending will of a resumed session and publishes it
now if the old session ended (clean start). The connection's release (and a takeover's kick
reply) waits until the router has it (services/connection/settling.py, bounded): a client
that comes back at once, on any node, then finds it there to cancel or publish. Without
that wait a clean start on another node could settle before the will arrived, which the
router would then hold for its whole delay. Tried again with backoff for KEEP_FOR_S.
Only a client id that had a session can have one pending (the delay never outlasts the
session): the session service says so at CONNECT, and the other CONNECTs skip the router
call.

A node that dies publishes nothing: each CONNECT with a will therefore also hands it to the
session service (`Wills.handoff`), which keeps it with the connection's registry entry and
publishes it when it declares the node dead (services/session/wills.py). A connection that
ends while its node lives is released after its will went out, and takes its entry, will
included, with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from services.common.bus.ids import MessageIds
from services.common.dependencies import wait_for
from services.common.envelope import to_envelope
from services.common.message import Message, message_properties
from services.common.mqtt.packets import Will
from services.common.route_table import RouteResult
from services.common.tasks import TaskSet
from services.common.topics import is_sys_topic
from services.connection.channel import Channel
from services.router.client import RouterClient
from starling.common.v1.message_pb2 import RoutedMessage

log = logging.getLogger("starling.connection.wills")

KEEP_FOR_S = 30.0  # as long as the routing pipeline tries a publish the router did not take


class WillNotKeptError(RuntimeError):
    """The router did not take a delayed will (TRY_LATER): tried again."""


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
        router: RouterClient | None,
        tasks: TaskSet,
        ids: MessageIds,
        handoff_max_bytes: int = 0,
    ) -> None:
        self._node_id = node_id
        self._publish = publish
        self._router = router
        self._tasks = tasks
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

    def connection_ended(self, ch: Channel) -> asyncio.Task[None] | None:
        """Publish the will of a connection that ended without DISCONNECT; for a delayed
        one, the task that hands it to the router (the release waits for it)."""
        if ch.normal_disconnect:
            return None
        msg = will_message(ch, time.time())
        if msg is None:
            return None
        delay = will_delay_s(ch)
        if delay and self._router is not None:
            env = to_envelope(msg, self._node_id, self._ids.next())
            env.delay_s = delay
            return self._tasks.spawn(self._keep(env), name="delayed-will")
        self._publish([msg])
        return None

    async def _keep(self, env: RoutedMessage) -> None:
        """Hand a delayed will to the router until it takes it (same message id each time:
        the router holds one per client), for at most KEEP_FOR_S."""
        router = self._router
        assert router is not None

        async def attempt() -> None:
            if (await router.route([env]))[0] is RouteResult.TRY_LATER:
                raise WillNotKeptError(env.topic)

        try:
            await wait_for("router (delayed will)", attempt, KEEP_FOR_S, (Exception,))
        except Exception as exc:
            log.error("delayed_will_lost", extra={"error": type(exc).__name__})

    async def settle(self, tenant: str, client_id: str, resumed: bool) -> None:
        """A client connected: a delayed will of its previous connection is cancelled if the
        session was resumed, published now if the old session ended."""
        if self._router is None:
            return
        try:
            await self._router.settle_will(tenant, client_id, publish_now=not resumed)
        except Exception as exc:
            log.warning("settle_will_failed", extra={"error": type(exc).__name__})
