"""The `AuditStore` contract (the console's audit log): the embedded SQLite store, the
Cassandra store on the model of Cassandra (tests/simulation), and on a real cluster when
STARLING_TEST_CASSANDRA=host:port names one (skipped otherwise)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.store import cassandra_audit
from services.common.store.audit_log import DAY_MS, RETENTION_DAYS, AuditRecord, AuditStore
from services.common.store.cassandra_schema import check_migrations
from services.common.store.sqlite_audit import SqliteAuditStore
from tests.common.cassandra_target import cassandra_target


@pytest.fixture(params=["sqlite", "cassandra-model", "cassandra"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AuditStore]:
    if request.param == "sqlite":
        s: AuditStore = SqliteAuditStore(tmp_path / "audit.db")
    elif request.param == "cassandra-model":  # the real CQL on the model of Cassandra
        from cassandra import ConsistencyLevel

        from tests.simulation.session import SimBatch
        from tests.simulation.standin import model_session

        session = model_session(0, cassandra_audit.MIGRATIONS)
        s = cassandra_audit.CassandraAuditStore.on_session(
            session, ConsistencyLevel.SERIAL, SimBatch
        )
    else:
        t = cassandra_target()
        s = cassandra_audit.CassandraAuditStore(
            contact_points=t.contact_points,
            port=t.port,
            keyspace=t.keyspace,
            consistency=t.consistency,
        )
    yield s
    await s.close()


def _record(tenant: str, at_ms: int, action: str) -> AuditRecord:
    return AuditRecord(
        at_ms=at_ms,
        actor=f"tenant {tenant}",
        tenant=tenant,
        action=action,
        target="client c1",
        detail="reason: test",
        address="192.0.2.7",
        outcome="ok",
        record_id=uuid.uuid4().hex,
    )


async def test_recent_is_newest_first_and_scoped_by_tenant(store: AuditStore) -> None:
    acme, other = f"acme{uuid.uuid4().hex[:6]}", f"other{uuid.uuid4().hex[:6]}"
    now = int(time.time() * 1000)
    a1, o1, a2 = (
        _record(acme, now - 30, "kick"),
        _record(other, now - 20, "ban"),
        _record(acme, now - 10, "rule_create"),
    )
    for r in (a1, o1, a2):
        await store.append(r)
    assert await store.recent(acme, 10) == [a2, a1]
    assert await store.recent(other, 10) == [o1]
    everyone = [r for r in await store.recent(None, 100) if r.tenant in (acme, other)]
    assert everyone == [a2, o1, a1]
    assert await store.recent(acme, 1) == [a2]


def test_cassandra_migrations_are_numbered() -> None:
    check_migrations(cassandra_audit.MIGRATIONS)


async def test_recent_takes_the_newest_of_many(store: AuditStore) -> None:
    """More records than one page of a read (the model pages by 50): the newest `limit`."""
    tenant = f"busy{uuid.uuid4().hex[:6]}"
    now = int(time.time() * 1000)
    records = [_record(tenant, now - 1000 + i, f"change{i}") for i in range(70)]
    for r in records:
        await store.append(r)
    assert await store.recent(tenant, 55) == records[::-1][:55]


async def test_records_past_the_retention_are_not_kept(store: AuditStore) -> None:
    tenant = f"old{uuid.uuid4().hex[:6]}"
    now = int(time.time() * 1000)
    await store.append(_record(tenant, now - (RETENTION_DAYS + 1) * DAY_MS, "too_old"))
    await store.append(_record(tenant, now, "kept"))
    assert [r.action for r in await store.recent(tenant, 10)] == ["kept"]
