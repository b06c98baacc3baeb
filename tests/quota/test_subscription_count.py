"""The tenant-wide subscription count: the quota service's atomic script over Redis
(services/common/subscription_counts.py) and a node's side of it (services/connection/
subscription_slots.py), with a fake quota service."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import cast

import pytest
from redis.asyncio import Redis

from services.common.limits_copies import LimitsCopies
from services.common.quota_keys import limits_key
from services.common.subscription_counts import SubscriptionCounts
from services.connection.subscription_slots import SubscriptionSlots
from services.quota.client import Limits, QuotaClient
from tests.poll import eventually


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_url)
    yield r
    await r.aclose()


async def test_slots_are_granted_below_the_limit_from_every_nodes_figure(redis: Redis) -> None:
    counts = SubscriptionCounts(redis)
    t = f"t{uuid.uuid4().hex[:6]}"
    await redis.hset(limits_key(t), mapping={"max_tenant_subscriptions": 10})  # type: ignore[misc]
    assert await counts.hold(t, "n1", 0, 4) == (4, 10)
    assert await counts.hold(t, "n2", 0, 5) == (5, 10)
    assert await counts.hold(t, "n2", 5, 3) == (1, 10)  # what is left
    assert await counts.hold(t, "n1", 4, 1) == (0, 10)
    assert await counts.total(t) == 10
    # A node's figure is absolute: n1's clients dropped 3 (a lost report changes nothing).
    assert await counts.hold(t, "n1", 1, 0) == (0, 0)
    assert await counts.hold(t, "n1", 1, 0) == (0, 0)
    assert await counts.total(t) == 7
    assert await counts.hold(t, "n1", 1, 5) == (3, 10)
    # n2 died: its figure goes, from every tenant it counted in.
    u = f"u{uuid.uuid4().hex[:6]}"
    assert await counts.hold(u, "n2", 0, 2) == (2, 0)  # no limit: granted, still counted
    await counts.drop_node("n2")
    assert await counts.total(t) == 4
    assert await counts.total(u) == 0
    assert await counts.hold(t, "n1", 4, 7) == (6, 10)


class FakeQuota:
    """The quota service's HoldSubscriptions over a dict, recording the calls."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.figures: dict[str, int] = {}
        self.calls: list[tuple[int, int]] = []
        self.fail = False

    async def get_limits(self, tenant: str, user: str = "") -> Limits:
        return Limits(max_tenant_subscriptions=self.limit)

    async def hold_subscriptions(
        self, tenant: str, node_id: str, held: int, amount: int = 0
    ) -> tuple[int, int]:
        self.calls.append((held, amount))
        if self.fail:
            raise ConnectionError("down")
        self.figures[node_id] = held
        grant = amount
        if self.limit:
            grant = max(0, min(amount, self.limit - sum(self.figures.values())))
        self.figures[node_id] += grant
        return grant, self.limit

    async def close(self) -> None:
        pass


class Msg:
    def __init__(self, data: bytes) -> None:
        self.data = data


def _slots(quota: FakeQuota, counts: dict[str, int]) -> tuple[SubscriptionSlots, LimitsCopies]:
    client = cast(QuotaClient, quota)  # stands in for both clients
    limits = LimitsCopies(client)
    return SubscriptionSlots(client, "n1", limits, counts), limits


async def test_a_node_asks_for_new_filters_and_reports_what_it_gave_back() -> None:
    quota = FakeQuota(limit=5)
    counts = {"t": 0}
    slots, _ = _slots(quota, counts)
    counts["t"] = 3  # three new filters entered the trie
    assert await slots.admit("t", 3) == 3
    assert quota.calls[-1] == (0, 3)
    quota.figures["n2"] = 1  # another node holds one
    counts["t"] = 6
    assert await slots.admit("t", 3) == 1  # reported 3 held, one slot left
    counts["t"] = 4  # the two refused left the trie again
    counts["t"] = 2  # then a client unsubscribed two
    slots.changed("t")
    await eventually(lambda: quota.figures["n1"] == 2, 5, lambda: f"n1 at {quota.figures}")
    # The quota service down: new filters are admitted, and reported once it is back.
    quota.fail = True
    counts["t"] = 4
    assert await slots.admit("t", 2) == 2
    # Right after a failure the next SUBSCRIBE does not wait for another call.
    calls = len(quota.calls)
    counts["t"] = 5
    assert await slots.admit("t", 1) == 1
    assert len(quota.calls) == calls
    quota.fail = False
    await slots.sync()
    assert quota.figures["n1"] == 5
    calls = len(quota.calls)
    await slots.sync()  # nothing changed: no call
    assert len(quota.calls) == calls


async def test_a_tenant_limited_later_is_reported_and_unlimited_ones_cost_no_call() -> None:
    quota = FakeQuota(limit=0)
    counts = {"t": 7}
    slots, limits = _slots(quota, counts)
    assert await slots.admit("t", 2) == 2
    await slots.sync()
    assert quota.calls == []
    quota.limit = 8
    await limits._on_change(Msg(b"t"))  # type: ignore[arg-type]  # the announced change
    await eventually(
        lambda: limits.get("t").limits.max_tenant_subscriptions == 8, 5, "the changed limit"
    )
    await slots.sync()
    assert quota.figures == {"n1": 7}
    counts["t"] = 8
    assert await slots.admit("t", 1) == 1
    counts["t"] = 9
    assert await slots.admit("t", 1) == 0
