"""Wills of connections whose node died: kept with each connection's registry entry, and
published by the session service when that node can no longer publish them.

A node publishes the will of a connection that ends without DISCONNECT itself
(services/connection/wills.py), and then releases the connection's registry entry. A node
that is killed publishes nothing, so each CONNECT with a will also hands it here
(ConnectRequest.will) and the entry keeps it while the connection lives. It is published
from here:
- when this service declares the node dead (no heartbeat for `node_timeout_s`, or the node
  id started again: services/session/liveness.py) and the entry is still the node's: now,
  or after what is left of its Will Delay Interval (the router holds it as a delayed will,
  cancelled if the client resumes its session first [MQTT-3.1.3-9]);
- when a new connection takes the client id over and the old node does not answer the kick
  (it died; the liveness check would find the entry gone): now if its delay is 0 or the new
  connection ends the session (clean start), otherwise never (the client came back within
  the delay).
Only one session instance releases an entry (the registry's release is atomic), so one
publishes its will. What can publish one twice: a node killed after it published a will
and before the release reached this service, or a kick answered later than the wait for it.

Checked at CONNECT, as the node checks before it publishes: the connection's ACL must allow
the will's topic. Bound: a will larger than `will_store_max_bytes` (envelope bytes) is not
kept, so its node alone can publish it; at most one will per connection is held in Redis.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Sequence

from services.common.acl import AclChecker, AclRule
from services.common.bus.publisher import ServicePublisher
from services.session.registry import Holder
from starling.common.v1.message_pb2 import RoutedMessage

log = logging.getLogger("starling.session.wills")

ATTEMPTS = 3  # a router call that fails is tried again this many times in all
RETRY_S = 1.0


def kept_will(will: bytes, rules: list[AclRule], default_allow: bool, max_bytes: int) -> str:
    """What the registry entry keeps of a CONNECT's will ("" none): its envelope, if it
    fits and the connection may publish its topic."""
    if not will or len(will) > max_bytes:
        return ""
    try:
        topic = RoutedMessage.FromString(will).topic
    except Exception:  # a node sent garbage: it publishes its own wills still
        return ""
    if not AclChecker(rules, default_allow).can_publish(topic):
        return ""
    return base64.b64encode(will).decode()


class StoredWills:
    def __init__(self, publisher: ServicePublisher) -> None:
        self._publisher = publisher
        self.published = 0  # wills handed to the mesh (tests, logs)

    async def publish(self, holders: Sequence[Holder], died_at_ms: int) -> None:
        """Publish the wills of `holders`, whose node died at `died_at_ms`: each after what
        is left of its delay."""
        now_ms = int(time.time() * 1000)
        elapsed_s = max(0, (now_ms - died_at_ms) // 1000)
        envs = [
            self._envelope(h, max(0, h.will_delay_s - elapsed_s), now_ms) for h in holders if h.will
        ]
        await self._send([e for e in envs if e is not None])

    async def publish_now(self, holder: Holder) -> None:
        """Publish the will of `holder` now, whatever its delay."""
        env = self._envelope(holder, 0, int(time.time() * 1000))
        if env is not None:
            await self._send([env])

    def _envelope(self, h: Holder, delay_s: int, now_ms: int) -> RoutedMessage | None:
        try:
            env = RoutedMessage.FromString(base64.b64decode(h.will))
        except Exception:
            log.warning("stored_will_unreadable", extra={"client_id": h.client_id})
            return None
        env.tenant = h.tenant
        env.message_id = self._publisher.next_id()
        env.published_at_ms = now_ms
        env.delay_s = delay_s
        return env

    async def _send(self, envs: list[RoutedMessage]) -> None:
        if not envs:
            return
        for attempt in range(1, ATTEMPTS + 1):
            try:
                await self._publisher.publish_envelopes(envs)
                self.published += len(envs)
                log.info("stored_wills_published", extra={"wills": len(envs)})
                return
            except Exception as exc:
                if attempt == ATTEMPTS:
                    log.warning(
                        "stored_wills_lost",
                        extra={"wills": len(envs), "error": type(exc).__name__},
                    )
                    return
                await asyncio.sleep(RETRY_S)
