"""The `BanStore` contract: the embedded SQLite store, and Cassandra when
STARLING_TEST_CASSANDRA=host:port names a reachable cluster (skipped otherwise). Two store
objects on one backend stand for two quota instances: each sees what the other wrote."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from services.common.bans import Ban, BanKind
from services.common.store import cassandra_bans
from services.common.store.cassandra_schema import check_migrations
from services.common.store.ports_bans import BanStore
from services.common.store.sqlite_bans import SqliteBanStore
from tests.common.cassandra_model import model_for, on_model
from tests.common.cassandra_target import cassandra_target
from tests.poll import eventually


@pytest.fixture(params=["sqlite", "model", "cassandra"])
async def opener(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Callable[[], BanStore]]:
    """Opens another store object on the same backend (another quota instance)."""
    opened: list[BanStore] = []
    model = model_for(cassandra_bans.CassandraBanStore)  # one model cluster for both

    def open_one() -> BanStore:
        if request.param == "sqlite":
            s: BanStore = SqliteBanStore(tmp_path / "quota" / "bans.sqlite3")
        elif request.param == "model":  # the Cassandra store on the simulator's model
            s = on_model(cassandra_bans.CassandraBanStore, model)
        else:
            t = cassandra_target()
            s = cassandra_bans.CassandraBanStore(
                contact_points=t.contact_points,
                port=t.port,
                keyspace=t.keyspace,
                consistency=t.consistency,
            )
        opened.append(s)
        return s

    yield open_one
    for s in opened:
        await s.close()


def ban(tenant: str, value: str, expires_at_ms: int = 0, created: int = 1) -> Ban:
    return Ban(
        kind=BanKind.CLIENT_ID,
        tenant=tenant,
        value=value,
        reason="abuse",
        expires_at_ms=expires_at_ms,
        created_at_ms=created,
    )


def mine(bans: list[Ban], tenant: str) -> list[Ban]:
    return [b for b in bans if b.tenant == tenant]


async def test_two_instances_share_one_list(opener: Callable[[], BanStore]) -> None:
    a, b = opener(), opener()
    t = f"t{uuid.uuid4().hex[:6]}"
    assert await a.put(ban(t, "c1", created=1), max_bans=0)
    assert await b.put(ban(t, "c2", created=2), max_bans=0)
    assert mine(await a.list(), t) == mine(await b.list(), t) == [ban(t, "c1"), ban(t, "c2", 0, 2)]
    # A replacement (same kind, tenant, value) changes the one entry.
    changed = Ban(kind=BanKind.CLIENT_ID, tenant=t, value="c1", reason="again", created_at_ms=1)
    assert await b.put(changed, max_bans=0)
    assert mine(await a.list(), t)[0].reason == "again"
    assert await b.remove(BanKind.CLIENT_ID, t, "c1")
    assert not await a.remove(BanKind.CLIENT_ID, t, "c1")
    assert mine(await a.list(), t) == [ban(t, "c2", 0, 2)]
    await a.remove(BanKind.CLIENT_ID, t, "c2")


async def test_the_cap_counts_every_instances_bans(opener: Callable[[], BanStore]) -> None:
    a, b = opener(), opener()
    t = f"t{uuid.uuid4().hex[:6]}"
    held = len(await a.list())  # Cassandra: other runs' bans in the shared keyspace
    assert await a.put(ban(t, "c1"), max_bans=held + 2)
    assert await b.put(ban(t, "c2"), max_bans=held + 2)
    assert not await a.put(ban(t, "c3"), max_bans=held + 2), "past max_bans"
    assert await a.put(ban(t, "c2"), max_bans=held + 2), "a replacement is no new ban"
    assert [x.value for x in mine(await b.list(), t)] == ["c1", "c2"]
    for v in ("c1", "c2"):
        await a.remove(BanKind.CLIENT_ID, t, v)


async def test_an_expired_ban_is_not_listed(opener: Callable[[], BanStore]) -> None:
    a = opener()
    t = f"t{uuid.uuid4().hex[:6]}"
    soon = int(time.time() * 1000) + 300
    assert await a.put(ban(t, "brief", expires_at_ms=soon), max_bans=0)
    assert [x.value for x in mine(await a.list(), t)] == ["brief"]

    async def gone() -> bool:
        return not mine(await a.list(), t)

    # Polled toward a deadline: the ban's own expiry.
    await eventually(gone, 5, "the expired ban unlisted", every_s=0.05)


def test_ttl_never_ends_a_ban_early() -> None:
    assert cassandra_bans.ttl_s(0, 1000) == 0  # until removed: no TTL
    assert cassandra_bans.ttl_s(2001, 1000) == 2  # 1.001 s left: 2 s
    assert cassandra_bans.ttl_s(500, 1000) == 1  # already past: the shortest TTL
    check_migrations(cassandra_bans.MIGRATIONS)
