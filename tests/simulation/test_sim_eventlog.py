"""The Cassandra event log's real code (services/common/store/cassandra_eventlog*.py) on the
model of Cassandra (tests/simulation): `Simulated`, the store as the event-log contract tests
(tests/common/test_store_contract_eventlog.py) run it, and what only Cassandra's layout has:
reads that find their slices through the indexes, and a log from before the slices."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

from services.common.store.eventlog import (
    ROUTE_KINDS,
    STREAM_KINDS,
    EventKind,
    LogEvent,
    bucket_of,
    position_at,
)
from services.common.store.ports_session import SubscriptionRecord


class Simulated:
    """The Cassandra store's real code on tests/simulation's model of Cassandra (no faults:
    the contract, not the races): each call is one process the seeded scheduler runs to
    its end, the model's clock moving a millisecond a step."""

    def __init__(self) -> None:
        from cassandra import ConsistencyLevel

        from services.common.store.cassandra_session import MIGRATIONS, CassandraSessionStore
        from tests.simulation.cluster import NO_FAULTS, Cluster
        from tests.simulation.scheduler import Scheduler
        from tests.simulation.session import SimBatch, SimSession

        cluster = Cluster(random.Random(1), NO_FAULTS)
        self._sched = Scheduler(random.Random(2), 0.0, 0)
        self._sched.on_step.append(lambda: setattr(cluster, "now_us", cluster.now_us + 1000))
        session = SimSession(cluster, self._sched)
        session.create(MIGRATIONS)
        self._store = CassandraSessionStore.on_session(
            session, ConsistencyLevel.LOCAL_SERIAL, SimBatch
        )

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            out: list[Any] = []

            async def proc() -> None:
                out.append(await attr(*args, **kwargs))

            await self._sched.run({"call": proc()}, self._sched.step + 1_000_000)
            return out[0]

        return call


def _tenant() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


async def test_simulated_reading_from_the_start_reads_only_slices_that_exist() -> None:
    """Boot without a snapshot reads the log from position 0: the Cassandra store finds
    the slices through its indexes instead of asking for every hour since 2024 (about
    25,000 queries then; each store call is one scheduler step here)."""
    store = Simulated()
    t = _tenant()
    await store.put_subscriptions([SubscriptionRecord(t, "c", 1, f"f/{i}", 1) for i in range(3)])
    await store.append_events([LogEvent(t, EventKind.CONNECTED, "c", 1)])
    before = store._sched.step
    assert len(await store.read_events(0, 100)) == 3
    assert len(await store.read_events(0, 100, kinds=ROUTE_KINDS | STREAM_KINDS)) == 4
    assert store._sched.step - before < 200


async def test_simulated_a_log_from_before_slices_is_read_and_pruned() -> None:
    """Rows of the hour-partitioned layout (migration 4, before 7) are read with the new
    ones, in order, and pruned by whole hours like them."""
    store = Simulated()
    t = _tenant()
    b = bucket_of(position_at(int(time.time() * 1000))) - 2
    old = position_at(b * 3_600_000 + 5)
    session = store._session
    for cql, args in (
        (
            "INSERT INTO event_log (tenant, bucket, position, kind, client_id, incarnation, "
            "topic, options, data) VALUES (?,?,?,?,?,?,?,?,?)",
            (t, b, old, EventKind.SUBSCRIBED, "c", 1, "old", 1, b""),
        ),
        ("INSERT INTO event_log_tenants (bucket, tenant) VALUES (?,?)", (b, t)),
        ("INSERT INTO event_log_hours (scope, bucket) VALUES (?,?)", ("routes", b)),
    ):
        await store._exec(session.prepare(cql), args)
    new = await store.put_subscriptions([SubscriptionRecord(t, "c", 1, "new", 1)])
    for tenant in (t, None):
        got = await store.read_events(0, 10, tenant=tenant)
        assert [(e.position, e.topic) for e in got if e.tenant == t] == [(old, "old"), (new, "new")]
    await store.prune_events(position_at((b + 1) * 3_600_000))
    assert [e.topic for e in await store.read_events(0, 10, tenant=t)] == ["new"]
    assert old <= await store.pruned_through(t) < new  # the pruned hour, not the new row
