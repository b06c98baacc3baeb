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


def _u(
    client: str, change: str, pid: int, mid: str = "", inc: int = 1, epoch: int = 0
) -> Qos2Update:
    return Qos2Update("t", client, inc, change, pid, mid, epoch)


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


async def test_a_resumed_session_ignores_what_earlier_connections_write_late(
    store: SessionStore,
) -> None:
    a = f"a{uuid.uuid4().hex[:6]}"
    await store.record_qos2([_u(a, Qos2Change.RECEIVED, 1, "m1", epoch=10)])
    # Connection 20 resumes the session: it takes over what connection 10 recorded.
    assert await store.list_qos2("t", a, 1, fence=20) == [InboundQos2(1, "m1")]
    # Connection 10 was given up on with writes under way; they land now. Taken, the
    # RECEIVED would make a third connection take a new message under id 2 for a resend.
    await store.record_qos2(
        [
            _u(a, Qos2Change.RECEIVED, 2, "late", epoch=10),
            _u(a, Qos2Change.RELEASED, 1, epoch=10),
            _u(a, Qos2Change.STORED, 1, "m1", epoch=10),
        ]
    )
    assert await store.list_qos2("t", a, 1) == [InboundQos2(1, "m1")]
    # The resuming connection's own changes, and those of a later one, are taken.
    await store.record_qos2(
        [_u(a, Qos2Change.RELEASED, 1, epoch=20), _u(a, Qos2Change.RECEIVED, 2, "m2", epoch=20)]
    )
    await store.record_qos2([_u(a, Qos2Change.STORED, 2, "m2", epoch=30)])
    assert await store.list_qos2("t", a, 1, fence=30) == [InboundQos2(2, "m2", stored=True)]
    # A lower fence never lowers it; a change without an epoch (a node from before
    # fencing) is taken as before.
    await store.list_qos2("t", a, 1, fence=20)
    await store.record_qos2(
        [_u(a, Qos2Change.RECEIVED, 3, "x", epoch=25), _u(a, Qos2Change.RECEIVED, 4, "y")]
    )
    assert [q.packet_id for q in await store.list_qos2("t", a, 1)] == [2, 4]
    # Another session, or another incarnation of this one, has its own fence.
    await store.record_qos2([_u(a, Qos2Change.RECEIVED, 1, "n", inc=2, epoch=10)])
    assert await store.list_qos2("t", a, 2) == [InboundQos2(1, "n")]


async def test_dropping_the_state_drops_its_fence(store: SessionStore) -> None:
    a = f"a{uuid.uuid4().hex[:6]}"
    await store.list_qos2("t", a, 1, fence=50)
    await store.drop_qos2("t", a, 1)
    await store.record_qos2([_u(a, Qos2Change.RECEIVED, 1, "m", epoch=10)])
    assert await store.list_qos2("t", a, 1) == [InboundQos2(1, "m")]


async def test_survives_reopen(tmp_path: Path) -> None:
    s = SqliteSessionStore(tmp_path / "s.db")
    await s.record_qos2([_u("c", Qos2Change.RECEIVED, 65535, "m")])
    await s.close()
    s = SqliteSessionStore(tmp_path / "s.db")
    assert await s.list_qos2("t", "c", 1) == [InboundQos2(65535, "m")]
    await s.close()
