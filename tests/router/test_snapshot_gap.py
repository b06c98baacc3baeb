"""Two router instances on one store, and a compaction between them (issue 35): router A
holds the route table as of an old log position (paused, or idle in the tenant), router B
takes subscription changes, a compaction snapshots and prunes the log past A's position.
When A next replays the tenant it must notice the gap, reload the tenant from the snapshot
and route to every subscription B took -- not silently miss the pruned changes.

The instances are what services/router/main.py builds for several instances: a table booted
by `load_routes` and kept current by `RouteReplay` (services/router/cluster.py), each on its
own connection to the same embedded store; the compaction is the one the `routes-snapshot`
job falls back on (services/router/compaction.py: snapshot, then prune)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.route_table import RouteTable
from services.common.store.ports_session import SubscriptionRecord
from services.common.store.sqlite_session import SqliteSessionStore
from services.router.boot import load_routes
from services.router.cluster import RouteReplay
from services.router.compaction import compact

TENANT = "acme"


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[SqliteSessionStore, SqliteSessionStore]]:
    """Router A's and router B's connections to one store file."""
    a = SqliteSessionStore(tmp_path / "sessions.db")
    b = SqliteSessionStore(tmp_path / "sessions.db")
    yield a, b
    await a.close()
    await b.close()


def _receivers(table: RouteTable, topic: str) -> set[str]:
    """The persistent sessions a QoS 1 publish on `topic` is queued for."""
    return {t.client_id for t in table.targets(TENANT, topic, 1, False, "publisher")}


def _sub(client: str, topic_filter: str) -> SubscriptionRecord:
    return SubscriptionRecord(TENANT, client, 1, topic_filter, 1)


async def test_a_router_behind_a_prune_reloads_and_routes_to_every_subscription(
    stores: tuple[SqliteSessionStore, SqliteSessionStore], caplog: pytest.LogCaptureFixture
) -> None:
    store_a, store_b = stores
    await store_b.put_subscriptions([_sub("old", "s/#")])
    table_a = RouteTable()
    replay_a = RouteReplay(store_a, table_a, await load_routes(store_a, table_a))
    assert _receivers(table_a, "s/1") == {"old"}

    # A is paused; B takes changes: new sessions, one gone, one filter moved.
    await store_b.put_subscriptions([_sub(f"new-{i}", "s/+") for i in range(20)])
    await store_b.drop_subscriptions(TENANT, "old", 1)
    await store_b.put_subscriptions([_sub("mover", "elsewhere/#")])
    await store_b.delete_subscriptions(TENANT, "mover", 1, ["elsewhere/#"])
    await store_b.put_subscriptions([_sub("mover", "s/1")])
    report = await compact(store_b)
    assert report.pruned > 0  # B's changes are gone from the log

    with caplog.at_level(logging.WARNING, logger="starling.router.boot"):
        assert await replay_a.replay(TENANT)  # A resumes: another instance changed the table
    expected = {f"new-{i}" for i in range(20)} | {"mover"}
    assert _receivers(table_a, "s/1") == expected
    assert _receivers(table_a, "elsewhere/x") == set()
    assert "route_log_gap" in caplog.messages

    # After the reload A follows the log again from the snapshot's checkpoint.
    await store_b.put_subscriptions([_sub("late", "s/1")])
    await replay_a.replay(TENANT)
    assert _receivers(table_a, "s/1") == expected | {"late"}


async def test_a_tenant_emptied_while_a_router_was_behind_is_emptied_on_reload(
    stores: tuple[SqliteSessionStore, SqliteSessionStore],
) -> None:
    """The snapshot has no part of a tenant whose every subscription went: the reload
    must drop what A still holds, not keep it."""
    store_a, store_b = stores
    await store_b.put_subscriptions(
        [_sub("gone", "s/#"), SubscriptionRecord("other", "c", 1, "x", 1)]
    )
    table_a = RouteTable()
    replay_a = RouteReplay(store_a, table_a, await load_routes(store_a, table_a))
    assert _receivers(table_a, "s/1") == {"gone"}
    await store_b.drop_subscriptions(TENANT, "gone", 1)
    await compact(store_b)
    await replay_a.replay(TENANT)
    assert _receivers(table_a, "s/1") == set()


async def test_a_router_booting_after_the_prune_needs_no_reload(
    stores: tuple[SqliteSessionStore, SqliteSessionStore], caplog: pytest.LogCaptureFixture
) -> None:
    store_a, store_b = stores
    await store_b.put_subscriptions([_sub(f"c{i}", "s/#") for i in range(5)])
    await compact(store_b)
    await store_b.put_subscriptions([_sub("after", "s/1")])
    table_a = RouteTable()
    with caplog.at_level(logging.WARNING, logger="starling.router.boot"):
        boot = await load_routes(store_a, table_a)
        await RouteReplay(store_a, table_a, boot).replay(TENANT)
    assert boot.source == "snapshot"
    assert _receivers(table_a, "s/1") == {f"c{i}" for i in range(5)} | {"after"}
    assert "route_log_gap" not in caplog.messages
