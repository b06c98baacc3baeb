"""The node's hand-off to the rules engine (issue 17): a stand-in for the router of QoS>=1
publishes that also stores, concurrently, each message some rule of its tenant reads in the
durable RULES stream (services/rules/client.py), so the publisher's PUBACK/PUBREC waits for
both. A message the stream did not acknowledge comes back as TRY_LATER: the routing pipeline
retries it with the same message id, which the router, the queues and the stream all
de-duplicate on. One the stream refused because it is full (the rules service behind or down
for long: waiting would hold the publisher until it is dropped) comes back as
QUEUE_QUOTA_EXCEEDED: its publisher gets 0x97, as for a subscriber's full queue. A delayed
message (a will with a Will Delay Interval; a `$delayed` topic, which no rule filter matches)
goes to the rules when the router publishes it, when due (services/router/delaying.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from services.connection.routing import Router
from services.router.client import RouteResult
from services.rules.client import RuleFeed, StoreOutcome
from starling.common.v1.message_pb2 import RoutedMessage


class RulesRouter:
    def __init__(self, inner: Router, feed: RuleFeed) -> None:
        self._inner = inner
        self._feed = feed

    async def route(self, messages: Sequence[RoutedMessage]) -> list[RouteResult]:
        picked = self._picked(messages)
        if not picked:
            return await self._inner.route(messages)
        routed, stored = await asyncio.gather(
            self._inner.route(messages), self._feed.store_outcomes([messages[i] for i in picked])
        )
        results = list(routed)
        for i, outcome in zip(picked, stored, strict=True):
            if outcome is StoreOutcome.FAILED:
                results[i] = RouteResult.TRY_LATER
            elif outcome is StoreOutcome.FULL and results[i] is not RouteResult.TRY_LATER:
                results[i] = RouteResult.QUEUE_QUOTA_EXCEEDED
        return results

    def _picked(self, messages: Sequence[RoutedMessage]) -> list[int]:
        """The messages some rule reads (their indexes): none at all while no tenant has a
        rule, else one filter look-up per run of a tenant's messages."""
        feed = self._feed
        if not feed.reads_any():
            return []
        picked: list[int] = []
        tenant, trie = None, None
        for i, m in enumerate(messages):
            if m.tenant != tenant:
                tenant = m.tenant
                trie = feed.filters_of(tenant)
            # A delayed will reaches the rules when the router publishes it, not now.
            if trie is not None and not m.delay_s and trie.match(m.topic):
                picked.append(i)
        return picked
