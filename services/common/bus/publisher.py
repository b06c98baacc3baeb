"""Publishing into the mesh from a service, as a connection node's publish does: what must be
kept (QoS >= 1 or retained) goes through the router first (persistent sessions' queues, the
retained store), whose answer says it is kept; then every message goes on its topic's NATS
subject for the subscribers online now. Used by the rules service (republish action, MQTT
bridge in: services/rules/republisher.py), the `$SYS` publisher
(services/metrics/sys_publisher.py) and the session service (wills of a dead node's
clients: services/session/wills.py).

A call is one router call (cut by bytes in RouterClient.route) and, per topic subject, one
NATS message up to LIVE_BATCH_BYTES, not a round trip per message.

What the router did not keep never goes live (a subscriber online now would see a message a
persistent one never gets). Without a `not_kept` hook a call raises before anything goes
out (`NotKeptError`, or the router client's own error when it cannot be reached), so a
caller that must not lose it (a bridge that acknowledges upstream only afterwards) sends
the whole call again. With the hook, each message not kept (every one, when the router
cannot be reached) is handed to the hook and the others go out (`$SYS`: that value is
published again next round).

With a `rules` feed (the session service's wills), the messages a rule reads reach the rules
engine too: those the router kept are stored in the RULES stream (waiting for its
acknowledgement), QoS 0 ones are offered; a delayed one reaches the rules from the router, when
due. Best effort: a message the stream does not take (JetStream away) still goes out, and the
rules miss it (logged as `rules_feed_missed`); nothing here waits on the rules to deliver.
The rules service's own republisher has no feed, so a rule's output never feeds a rule.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from nats.aio.client import Client

from services.common.bus.ids import MessageIds
from services.common.envelope import to_envelope
from services.common.message import Message
from services.common.topics import topic_to_subject
from starling.common.v1.message_pb2 import RoutedBatch, RoutedMessage

log = logging.getLogger("starling.bus.publisher")

# Messages of one subject share a NATS message up to this size (well under NATS's 1 MiB
# max_payload); a larger message goes alone.
LIVE_BATCH_BYTES = 256 << 10


class RouteOutcome(Protocol):
    """What the router did with one message (services/common/route_table.py RouteResult)."""

    @property
    def kept(self) -> bool: ...

    @property
    def name(self) -> str: ...


class Router(Protocol):
    """The router's `route` (services/router/client.py RouterClient): one outcome per
    message, in order."""

    async def route(self, messages: Sequence[RoutedMessage]) -> Sequence[RouteOutcome]: ...


class NotKeptError(RuntimeError):
    """The router did not keep a message; nothing of the call went live."""


NotKept = Callable[[RoutedMessage], None]


class RulesFeed(Protocol):
    """The rules engine's intake (services/rules/client.py RuleFeed)."""

    def wanted(self, tenant: str, topic: str) -> bool: ...

    async def store(self, envs: Sequence[RoutedMessage]) -> list[bool]: ...

    def offer(self, env: RoutedMessage) -> None: ...


class ServicePublisher:
    def __init__(
        self,
        nc: Client,
        router: Router,
        node_id: str,
        not_kept: NotKept | None = None,
        rules: RulesFeed | None = None,
    ) -> None:
        self._nc = nc
        self._router = router
        self.rules = rules
        self._node_id = node_id
        self._not_kept = not_kept
        self._ids = MessageIds(node_id, time.time_ns())

    async def publish(self, messages: Sequence[Message]) -> None:
        await self.publish_envelopes(
            [to_envelope(m, self._node_id, self._ids.next()) for m in messages]
        )

    def next_id(self) -> str:
        """A message id for an envelope this publisher is handed."""
        return self._ids.next()

    async def publish_envelopes(
        self, envs: Sequence[RoutedMessage], not_kept: NotKept | None = None
    ) -> None:
        """`publish` for envelopes built by the caller (message ids from `next_id`), with
        this call's own `not_kept` hook if given. One with a `delay_s` (a delayed will) goes
        to the router alone, which holds it and publishes it, live too, when it is due."""
        kept = [env for env in envs if env.qos or env.retain or env.delay_s]
        live = [env for env in envs if not env.delay_s]
        refused: set[int] = set()
        if kept:
            # Kept first (the router answers once persistent sessions have it), then live.
            refused = await self._route(kept, not_kept or self._not_kept)
            if refused:
                live = [env for env in live if id(env) not in refused]
        await self._publish_live(live)
        if self.rules is not None:
            await self._feed_rules(kept, live, refused)

    async def _feed_rules(
        self, kept: list[RoutedMessage], live: list[RoutedMessage], refused: set[int]
    ) -> None:
        rules = self.rules
        assert rules is not None
        for env in live:
            if not env.qos and not env.retain and rules.wanted(env.tenant, env.topic):
                rules.offer(env)
        # Delayed ones go to the rules from the router, when due.
        stored = [
            env
            for env in kept
            if not env.delay_s and id(env) not in refused and rules.wanted(env.tenant, env.topic)
        ]
        if stored:
            missed = (await rules.store(stored)).count(False)
            if missed:
                log.warning("rules_feed_missed", extra={"count": missed})

    async def _route(self, kept: list[RoutedMessage], hook: NotKept | None) -> set[int]:
        """The ids of the envelopes not kept (handed to the hook); raises without a hook."""
        try:
            results = await self._router.route(kept)
        except Exception as exc:
            if hook is None:
                raise
            log.warning("bus_route_failed", extra={"error": type(exc).__name__})
            for env in kept:
                hook(env)
            return {id(env) for env in kept}
        refused: set[int] = set()
        for env, result in zip(kept, results, strict=True):
            if result.kept:
                continue
            if hook is None:
                raise NotKeptError(f"router did not keep {env.topic!r}: {result.name}")
            hook(env)
            refused.add(id(env))
        return refused

    async def _publish_live(self, envs: list[RoutedMessage]) -> None:
        by_subject: dict[str, list[RoutedMessage]] = {}
        for env in envs:
            by_subject.setdefault(topic_to_subject(env.tenant, env.topic), []).append(env)
        for subject, group in by_subject.items():
            batch = RoutedBatch()
            size = 0
            for env in group:
                n = env.ByteSize()
                if batch.messages and size + n > LIVE_BATCH_BYTES:
                    await self._nc.publish(subject, batch.SerializeToString())
                    batch, size = RoutedBatch(), 0
                batch.messages.append(env)
                size += n
            await self._nc.publish(subject, batch.SerializeToString())
