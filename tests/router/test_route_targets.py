"""The route table's answers for a topic are cached (services/common/route_table.py): every
change of a tenant's subscriptions must show in the next answer, and the cache stays bounded."""

from __future__ import annotations

import pytest

from services.common import route_table
from services.common.route_table import RouteTable
from services.common.store.ports_session import SubscriptionRecord


def _queues(table: RouteTable, tenant: str = "t", topic: str = "a/b") -> set[tuple[str, int]]:
    return {(x.client_id, x.qos) for x in table.targets(tenant, topic, 2, False, "pub")}


def test_each_change_shows_in_the_next_answer() -> None:
    table = RouteTable()
    assert _queues(table) == set()
    table.add(SubscriptionRecord("t", "c1", 1, "a/+", 1))
    assert _queues(table) == {("c1", 1)}
    table.add(SubscriptionRecord("t", "c2", 1, "a/#", 2))
    assert _queues(table) == {("c1", 1), ("c2", 2)}
    table.add(SubscriptionRecord("t", "c1", 1, "a/b", 2))  # a second filter: the higher QoS
    assert _queues(table) == {("c1", 2), ("c2", 2)}
    table.remove("t", "c1", 1, "a/b")
    assert _queues(table) == {("c1", 1), ("c2", 2)}
    table.drop("t", "c2", 1)
    assert _queues(table) == {("c1", 1)}
    table.clear()
    assert _queues(table) == set()


def test_routes_any_says_whether_a_tenant_has_a_persistent_subscription() -> None:
    """The node's copy skips planning a tenant's publishes when it says no."""
    table = RouteTable()
    assert not table.routes_any("t")
    table.add(SubscriptionRecord("t", "c1", 1, "a/+", 1))
    assert table.routes_any("t") and not table.routes_any("u")
    table.remove("t", "c1", 1, "a/+")
    assert not table.routes_any("t")  # its trie is still there, empty
    table.add(SubscriptionRecord("t", "c1", 1, "#", 1))
    table.drop("t", "c1", 1)
    assert not table.routes_any("t")


def test_no_local_and_other_tenants_are_kept_apart() -> None:
    table = RouteTable()
    table.add(SubscriptionRecord("t", "pub", 1, "a/b", 1, no_local=True))
    table.add(SubscriptionRecord("u", "c", 1, "a/b", 1))
    assert table.targets("t", "a/b", 1, False, "pub") == ()
    assert [x.client_id for x in table.targets("t", "a/b", 1, False, "other")] == ["pub"]
    table.add(SubscriptionRecord("u", "d", 1, "a/b", 1))  # a change of u leaves t's answers
    assert _queues(table, "u") == {("c", 1), ("d", 1)}
    assert [x.client_id for x in table.targets("t", "a/b", 1, False, "other")] == ["pub"]


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(route_table, "TARGETS_CACHED", 10)
    table = RouteTable()
    table.add(SubscriptionRecord("t", "c", 1, "#", 1))
    for i in range(25):
        assert _queues(table, topic=f"x/{i}") == {("c", 1)}
    assert table._targets_cached <= 10
    assert sum(len(c) for c in table._targets.values()) == table._targets_cached
