"""A tenant's offline sessions by client id, a page at a time: one contract for every session
store (the Cassandra store on the simulator's model, and on a real cluster when
STARLING_TEST_CASSANDRA=host:port names one)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.common.store.ports_session import SessionRecord
from services.common.store.sqlite_session import SqliteSessionStore
from tests.common.cassandra_model import on_model
from tests.common.cassandra_target import cassandra_target


@pytest.fixture(params=["sqlite", "model", "cassandra"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "sqlite":
        s: Any = SqliteSessionStore(tmp_path / "sessions.db")
    else:
        from services.common.store.cassandra_session import CassandraSessionStore

        if request.param == "model":
            s = on_model(CassandraSessionStore)
        else:
            t = cassandra_target()
            s = CassandraSessionStore(
                contact_points=t.contact_points,
                port=t.port,
                keyspace=t.keyspace,
                consistency=t.consistency,
            )
    yield s
    await s.close()


def _parked(tenant: str, client_id: str, at_ms: int = 1_000) -> SessionRecord:
    return SessionRecord(tenant, client_id, 1, 3600, False, at_ms, "u", 0)


async def _all(store: Any, tenant: str, prefix: str = "", limit: int = 3) -> list[str]:
    seen: list[str] = []
    after = ""
    while True:
        page = await store.offline_sessions(tenant, after=after, prefix=prefix, limit=limit)
        seen += [r.client_id for r in page]
        if len(page) < limit:
            return seen
        after = page[-1].client_id


async def test_pages_parked_sessions_by_client_id(store: Any) -> None:
    tenant = f"t{uuid.uuid4().hex[:6]}"
    names = ["b2", "a1", "b1", "c", "b10", "é", "a2"]
    for name in names:
        await store.replace_session(_parked(tenant, name), None)
    # Another tenant's, a connected one and one a clean start ended are not listed.
    await store.replace_session(_parked("other" + tenant, "a0"), None)
    await store.replace_session(SessionRecord(tenant, "live", 1, 3600, True, 0, "u", 0), None)
    await store.replace_session(SessionRecord(tenant, "ended", 1, 0, False, 0, "u", 0), None)
    assert await _all(store, tenant) == sorted(names)
    assert await _all(store, tenant, prefix="b") == ["b1", "b10", "b2"]
    first = await store.offline_sessions(tenant, after="", prefix="a", limit=10)
    assert first == [_parked(tenant, "a1"), _parked(tenant, "a2")]
    assert await store.offline_sessions(tenant, after="a2", prefix="a", limit=10) == []


async def test_resumed_and_deleted_sessions_leave_the_list(store: Any) -> None:
    tenant = f"t{uuid.uuid4().hex[:6]}"
    a, b = _parked(tenant, "a"), _parked(tenant, "b")
    await store.replace_session(a, None)
    await store.replace_session(b, None)
    resumed = dataclasses.replace(a, connected=True, disconnected_at_ms=0)
    assert await store.replace_session(resumed, a)
    assert await store.delete_session(tenant, "b", 1)
    assert await store.offline_sessions(tenant, after="", prefix="", limit=10) == []
    parked_again = dataclasses.replace(resumed, connected=False, disconnected_at_ms=5)
    assert await store.replace_session(parked_again, resumed)
    assert await store.offline_sessions(tenant, after="", prefix="", limit=10) == [parked_again]
