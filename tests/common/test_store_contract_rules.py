"""The `RuleStore` contract: the embedded SQLite store, and Cassandra when
STARLING_TEST_CASSANDRA=host:port names a reachable cluster (skipped otherwise)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.store import cassandra_rules
from services.common.store.cassandra_schema import check_migrations
from services.common.store.ports_rules import RuleRecord, RuleStore
from services.common.store.sqlite_rules import SqliteRuleStore
from tests.common.cassandra_model import on_model
from tests.common.cassandra_target import cassandra_target


@pytest.fixture(params=["sqlite", "model", "cassandra"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RuleStore]:
    if request.param == "sqlite":
        s: RuleStore = SqliteRuleStore(tmp_path / "rules.db")
    elif request.param == "model":  # the Cassandra store on the simulator's model
        s = on_model(cassandra_rules.CassandraRuleStore)
    else:
        t = cassandra_target()
        s = cassandra_rules.CassandraRuleStore(
            contact_points=t.contact_points,
            port=t.port,
            keyspace=t.keyspace,
            consistency=t.consistency,
        )
    yield s
    await s.close()


async def test_put_get_list_replace_delete(store: RuleStore) -> None:
    acme, other = f"acme{uuid.uuid4().hex[:6]}", f"other{uuid.uuid4().hex[:6]}"
    r1 = RuleRecord(acme, "r1", 'SELECT * FROM "a"', '[{"kind":"republish"}]', True, 1, 1, "d")
    r2 = RuleRecord(acme, "r0", 'SELECT * FROM "b"', "[]", False, 2, 2)
    o1 = RuleRecord(other, "r1", 'SELECT * FROM "c"', "[]", True, 3, 3)
    for r in (r1, r2, o1):
        await store.put_rule(r)
    assert await store.get_rule(acme, "r1") == r1
    assert await store.get_rule(acme, "nope") is None
    assert await store.list_rules(acme) == [r2, r1]  # by rule id
    mine = [r for r in await store.list_rules() if r.tenant in (acme, other)]
    assert mine == [r2, r1, o1]
    changed = RuleRecord(acme, "r1", 'SELECT qos FROM "a"', "[]", False, 1, 9)
    await store.put_rule(changed)
    assert await store.get_rule(acme, "r1") == changed
    assert await store.delete_rule(acme, "r1") is True
    assert await store.delete_rule(acme, "r1") is False
    assert await store.list_rules(acme) == [r2]
    assert await store.get_rule(other, "r1") == o1  # another tenant's rule of the same id


async def test_auto_subscriptions_add_replace_list_delete(store: RuleStore) -> None:
    acme, other = f"acme{uuid.uuid4().hex[:6]}", f"other{uuid.uuid4().hex[:6]}"
    await store.put_auto_subscription(acme, "cmd/%c", 1)
    await store.put_auto_subscription(acme, "all/#", 0)
    await store.put_auto_subscription(other, "x", 2)
    assert await store.list_auto_subscriptions(acme) == [(acme, "all/#", 0), (acme, "cmd/%c", 1)]
    await store.put_auto_subscription(acme, "cmd/%c", 2)  # the same filter: its QoS replaced
    mine = [s for s in await store.list_auto_subscriptions() if s[0] in (acme, other)]
    assert mine == [(acme, "all/#", 0), (acme, "cmd/%c", 2), (other, "x", 2)]
    assert await store.delete_auto_subscription(acme, "all/#") is True
    assert await store.delete_auto_subscription(acme, "all/#") is False
    assert await store.list_auto_subscriptions(acme) == [(acme, "cmd/%c", 2)]


async def test_rules_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "rules.db"
    s = SqliteRuleStore(path)
    rec = RuleRecord("t", "r", 'SELECT * FROM "a"', "[]", True, 1, 1)
    await s.put_rule(rec)
    await s.close()
    s = SqliteRuleStore(path)
    assert await s.list_rules() == [rec]
    await s.close()


def test_cassandra_migrations_are_numbered() -> None:
    check_migrations(cassandra_rules.MIGRATIONS)
