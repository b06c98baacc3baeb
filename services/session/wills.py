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
  cancelled if the client resumes its session first [MQTT-3.1.3-9]). Published as the
  entries are released, a chunk at a time, so that a client that comes back meanwhile
  finds its delayed will at the router already (its new connection cancels it there);
- when a new connection takes the client id over and the old node is gone (nobody answers
  the kick on its subject, it answers as a new process that never had the connection, or
  its heartbeat stopped): now if it is due (its delay is 0 or has run out since the node's
  last heartbeat, or the new connection ends the session with a clean start), otherwise
  never (the client came back within its delay).
Only one session instance releases an entry (the registry's release is atomic), so one
publishes its will. What can publish one twice: a node killed after it published a will and
before its release reached this service. What can publish one that MQTT would not: a node
killed after a client's DISCONNECT and before its release (milliseconds).

Checked at CONNECT, as the node checks before it publishes: the connection's ACL must allow
the will's topic. Bound: a will larger than `will_store_max_bytes` (envelope bytes; the
node does not even send it) is not kept, so its node alone can publish it.

A will the router cannot take (unreachable, or a queue or retained quota refuses it) is
tried again with backoff for RETRY_FOR_S; what it did take goes to online subscribers once.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence

from services.common import clock
from services.common.acl import AclChecker, AclRule
from services.common.bus.publisher import NotKeptError, ServicePublisher
from services.common.dependencies import wait_for
from services.common.tasks import TaskSet
from services.common.topics import is_sys_topic
from services.session.registry import Holder
from starling.common.v1.message_pb2 import RoutedMessage

log = logging.getLogger("starling.session.wills")

RETRY_FOR_S = 30.0  # as long as a node retries a publish the router did not take


def kept_will(will: bytes, rules: list[AclRule], default_allow: bool, max_bytes: int) -> str:
    """What the registry entry keeps of a CONNECT's will ("" none): its envelope, if it
    fits and the connection may publish its topic."""
    if not will or len(will) > max_bytes:
        return ""
    try:
        topic = RoutedMessage.FromString(will).topic
    except Exception:  # a node sent garbage: it publishes its own wills still
        return ""
    if not topic or is_sys_topic(topic) or not AclChecker(rules, default_allow).can_publish(topic):
        return ""
    return base64.b64encode(will).decode()


def displaced_will_due(holder: Holder, clean_start: bool, silent_s: float) -> bool:
    """A new connection took over `holder` from a node that is gone, `silent_s` after the
    node's last heartbeat: whether its will is due now [MQTT-3.1.3-9] (otherwise the client
    is back within its Will Delay Interval, and the will is not published)."""
    return holder.will_delay_s == 0 or clean_start or silent_s >= holder.will_delay_s


class StoredWills:
    def __init__(self, publisher: ServicePublisher) -> None:
        self._publisher = publisher
        self._tasks = TaskSet()  # publishes of displaced wills, off the CONNECT path

    async def publish(self, holders: Sequence[Holder], died_at_ms: int) -> None:
        """Publish the wills of `holders`, whose node died at `died_at_ms`: each after what
        is left of its delay."""
        now_ms = clock.now_ms()
        elapsed_s = max(0, (now_ms - died_at_ms) // 1000)
        envs = [
            self._envelope(h, max(0, h.will_delay_s - elapsed_s), now_ms) for h in holders if h.will
        ]
        await self._send([e for e in envs if e is not None])

    def publish_now(self, holder: Holder) -> None:
        """Publish the will of `holder` now, whatever its delay (in a task of its own: the
        CONNECT that displaced it does not wait)."""
        env = self._envelope(holder, 0, clock.now_ms())
        if env is not None:
            self._tasks.spawn(self._send([env]), name="displaced-will")

    async def settle(self, timeout_s: float) -> None:
        """On the way out: let the wills under way go (at most `timeout_s`)."""
        await self._tasks.wait(timeout_s)

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
        """Each will the router takes goes live once; the others are tried again, in a task
        of their own (the caller, e.g. the release of a dead node's entries, goes on)."""
        refused = await self._attempt(envs)
        if refused:
            self._tasks.spawn(self._retry(refused), name="will-retry")

    async def _attempt(self, envs: list[RoutedMessage]) -> list[RoutedMessage]:
        refused: list[RoutedMessage] = []
        try:
            await self._publisher.publish_envelopes(envs, not_kept=refused.append)
        except Exception as exc:  # NATS: what the router took is kept all the same
            log.warning("stored_wills_not_live", extra={"error": type(exc).__name__})
        return refused

    async def _retry(self, envs: list[RoutedMessage]) -> None:
        pending = envs

        async def again() -> None:
            nonlocal pending
            pending = await self._attempt(pending)
            if pending:
                raise NotKeptError(f"{len(pending)} wills not kept")

        try:
            await wait_for("router (wills)", again, RETRY_FOR_S, (NotKeptError,))
        except NotKeptError:
            log.warning("stored_wills_lost", extra={"wills": len(pending)})
