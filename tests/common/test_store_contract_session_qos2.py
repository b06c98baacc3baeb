"""The QoS 2 receiver state of persistent sessions, one contract for every session store
(Cassandra when STARLING_TEST_CASSANDRA=host:port names a reachable cluster)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.store.ports import InboundQos2, Qos2Change, Qos2Update, SessionStore
from services.common.store.sqlite_session import SqliteSessionStore

CASSANDRA = os.environ.get("STARLING_TEST_CASSANDRA", "")


@pytest.fixture(params=["sqlite", "cassandra"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    if request.param == "sqlite":
        s: SessionStore = SqliteSessionStore(tmp_path / "sessions.db")
    else:
        if not CASSANDRA:
            pytest.skip("Cassandra contract run needs STARLING_TEST_CASSANDRA=host:port")
        from services.common.store.cassandra_session import CassandraSessionStore

        host, _, port = CASSANDRA.partition(":")
        s = CassandraSessionStore(
            [host], int(port or 9042), keyspace="starling_test", consistency="ONE"
        )
    yield s
    await s.close()


def _u(client: str, change: str, pid: int, mid: str = "", inc: int = 1) -> Qos2Update:
    return Qos2Update("t", client, inc, change, pid, mid)


async def test_received_until_released_in_order_across_sessions(store: SessionStore) -> None:
    a, b = f"a{uuid.uuid4().hex[:6]}", f"b{uuid.uuid4().hex[:6]}"
    await store.record_qos2(
        [
            _u(a, Qos2Change.RECEIVED, 7, "m1"),
            _u(b, Qos2Change.RECEIVED, 7, "m2"),
            _u(a, Qos2Change.RECEIVED, 9, "m3"),
            _u(a, Qos2Change.RELEASED, 7),
            # The id is free again after PUBCOMP: a new message under it replaces nothing.
            _u(a, Qos2Change.RECEIVED, 7, "m4"),
        ]
    )
    assert await store.list_qos2("t", a, 1) == [InboundQos2(7, "m4"), InboundQos2(9, "m3")]
    assert await store.list_qos2("t", b, 1) == [InboundQos2(7, "m2")]
    assert await store.list_qos2("t", a, 2) == []  # another incarnation has nothing


async def test_stored_marks_only_the_message_it_names(store: SessionStore) -> None:
    a = f"a{uuid.uuid4().hex[:6]}"
    await store.record_qos2([_u(a, Qos2Change.RECEIVED, 1, "m1")])
    await store.record_qos2([_u(a, Qos2Change.STORED, 1, "m1")])
    assert await store.list_qos2("t", a, 1) == [InboundQos2(1, "m1", stored=True)]
    await store.record_qos2([_u(a, Qos2Change.RELEASED, 1), _u(a, Qos2Change.RELEASED, 1)])
    assert await store.list_qos2("t", a, 1) == []


async def test_dropping_a_session_forgets_its_state(store: SessionStore) -> None:
    a = f"a{uuid.uuid4().hex[:6]}"
    await store.record_qos2([_u(a, Qos2Change.RECEIVED, p, f"m{p}") for p in (1, 2, 3)])
    await store.drop_qos2("t", a, 1)
    assert await store.list_qos2("t", a, 1) == []


async def test_survives_reopen(tmp_path: Path) -> None:
    s = SqliteSessionStore(tmp_path / "s.db")
    await s.record_qos2([_u("c", Qos2Change.RECEIVED, 65535, "m")])
    await s.close()
    s = SqliteSessionStore(tmp_path / "s.db")
    assert await s.list_qos2("t", "c", 1) == [InboundQos2(65535, "m")]
    await s.close()
