"""What the router reports per tenant (services/router/report.py): shared subscriptions
(`$share/...`) apart from the others, also in a table booted from a routing snapshot, and
none of another tenant's."""

from __future__ import annotations

from services.common.refusals import Refusals
from services.common.route_table import RouteTable
from services.common.store.ports_session import SubscriptionRecord
from services.router.report import router_figures
from services.router.retained import RetainedIndex
from services.router.snapshot import decode_tenant, encode_tenant


def _table() -> RouteTable:
    table = RouteTable()
    for tenant, client, filt in (
        ("a", "c1", "$share/g/jobs/#"),
        ("a", "c2", "$share/g/jobs/#"),  # a second member of the same group
        ("a", "c2", "$share/h/x"),
        ("a", "c1", "plain/+"),
        ("a", "c1", "$SYS/#"),
        ("b", "c1", "$share/g/jobs/#"),
    ):
        table.add(SubscriptionRecord(tenant, client, 1, filt, 1))
    return table


def _figures(table: RouteTable) -> dict[str, tuple[int, int]]:
    return {
        c.tenant: (c.subscriptions, c.subscriptions_shared)
        for c in router_figures(table, RetainedIndex(), Refusals())
    }


def test_shared_subscriptions_are_reported_apart_per_tenant() -> None:
    table = _table()
    assert _figures(table) == {"a": (5, 3), "b": (1, 1)}
    table.remove("a", "c2", 1, "$share/g/jobs/#")
    assert _figures(table)["a"] == (4, 2)


def test_a_table_booted_from_a_snapshot_counts_the_same() -> None:
    table = _table()
    booted = RouteTable()
    for tenant in table.tenants():
        _, parts = encode_tenant(table, tenant)
        trie, sessions = decode_tenant(tenant, parts)
        booted.adopt(tenant, trie, sessions)
    assert _figures(booted) == _figures(table)
