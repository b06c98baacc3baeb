"""The QoS 2 receiver state of persistent sessions, one contract for every session store
(Cassandra when STARLING_TEST_CASSANDRA=host:port names a reachable cluster)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.common.store.ports_session import (
    InboundQos2,
    Qos2Change,
    Qos2Update,
    SessionRecord,
    SessionStore,
)
from services.common.store.sqlite_session import SqliteSessionStore
from tests.common.cassandra_model import on_model
from tests.common.cassandra_target import cassandra_target


@pytest.fixture(params=["sqlite", "model", "cassandra"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    if request.param == "sqlite":
        s: SessionStore = SqliteSessionStore(tmp_path / "sessions.db")
    elif request.param == "model":  # the Cassandra store on the simulator's model
        from services.common.store.cassandra_session import CassandraSessionStore

        s = on_model(CassandraSessionStore)
    else:
        t = cassandra_target()
        from services.common.store.cassandra_session import CassandraSessionStore

        s = CassandraSessionStore(
            contact_points=t.contact_points,
            port=t.port,
            keyspace=t.keyspace,
            consistency=t.consistency,
        )
    yield s
    await s.close()


def _u(
    client: str, change: str, pid: int, mid: str = "", inc: int = 1, fence: int = 0
) -> Qos2Update:
    return Qos2Update("t", client, inc, change, pid, mid, fence)


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


async def test_changes_of_an_earlier_connection_are_ignored_once_a_later_one_opened_it(
    store: SessionStore,
) -> None:
    a = f"a{uuid.uuid4().hex[:6]}"

    async def opened(fence: int, inc: int = 1) -> None:  # what Sessions.open writes
        await store.put_session(SessionRecord("t", a, inc, 60, True, qos2_fence=fence))

    await opened(10)
    await store.record_qos2([_u(a, Qos2Change.RECEIVED, 1, "m1", fence=10)])
    await opened(20)  # the next connection took the session over and read its state
    assert await store.list_qos2("t", a, 1) == [InboundQos2(1, "m1")]
    # The first connection was given up on with writes under way; they land now. Taken, the
    # RECEIVED would make a third connection take a new message under id 2 for a resend.
    await store.record_qos2(
        [
            _u(a, Qos2Change.RECEIVED, 2, "late", fence=10),
            _u(a, Qos2Change.RELEASED, 1, fence=10),
            _u(a, Qos2Change.STORED, 1, "m1", fence=10),  # marks only m1: always taken
        ]
    )
    assert await store.list_qos2("t", a, 1) == [InboundQos2(1, "m1", stored=True)]
    # The current connection's changes are taken; a change without a fence (a node from
    # before fencing) too.
    await store.record_qos2(
        [
            _u(a, Qos2Change.RELEASED, 1, fence=20),
            _u(a, Qos2Change.RECEIVED, 2, "m2", fence=20),
            _u(a, Qos2Change.RECEIVED, 4, "y"),
        ]
    )
    assert await store.list_qos2("t", a, 1) == [InboundQos2(2, "m2"), InboundQos2(4, "y")]
    # A fenced change for an incarnation the record no longer has, or for a session with no
    # record at all, is dropped: that session ended.
    await opened(30, inc=2)
    await store.record_qos2([_u(a, Qos2Change.RECEIVED, 5, "z", fence=30)])
    await store.record_qos2([_u(f"none{a}", Qos2Change.RECEIVED, 1, "z", fence=30)])
    assert [q.packet_id for q in await store.list_qos2("t", a, 1)] == [2, 4]
    assert await store.list_qos2("t", f"none{a}", 1) == []
    # The fence survives the session's other writes (disconnect, expiry clock).
    rec = await store.get_session("t", a)
    assert rec is not None and rec.qos2_fence == 30


async def test_survives_reopen(tmp_path: Path) -> None:
    s = SqliteSessionStore(tmp_path / "s.db")
    await s.record_qos2([_u("c", Qos2Change.RECEIVED, 65535, "m")])
    await s.close()
    s = SqliteSessionStore(tmp_path / "s.db")
    assert await s.list_qos2("t", "c", 1) == [InboundQos2(65535, "m")]
    await s.close()


async def test_a_session_record_is_replaced_only_as_it_was_read(store: SessionStore) -> None:
    """`replace_session`: compare-and-set against the record a decision was made from, so two
    session instances that decided from one record cannot both write theirs."""
    c = f"r{uuid.uuid4().hex[:6]}"
    first = SessionRecord("t", c, 1, 60, True, owner="u", qos2_fence=10)
    assert await store.replace_session(first, None)
    assert not await store.replace_session(first, None)  # one is there now
    # A takeover: the next connection raises the fence of the same incarnation.
    second = SessionRecord("t", c, 1, 60, True, owner="u", qos2_fence=11)
    assert await store.replace_session(second, first)
    # The first connection's close, decided from the record it read: refused.
    parked = SessionRecord("t", c, 1, 60, False, 1_000, "u", 10)
    assert not await store.replace_session(parked, first)
    assert await store.get_session("t", c) == second
    # The second's own close, and a clean start's end of the parked session, in turn.
    parked = SessionRecord("t", c, 1, 60, False, 1_000, "u", 11)
    assert await store.replace_session(parked, second)
    ended = SessionRecord("t", c, 1, 0, False, 0, "u", 11)
    assert not await store.replace_session(ended, second)  # stale: it is parked now
    assert await store.replace_session(ended, parked)
    assert await store.get_session("t", c) == ended
    # Expiry follows the record: ended since 0 is due at once.
    assert c in [r.client_id for r in await store.expired_sessions(1)]
