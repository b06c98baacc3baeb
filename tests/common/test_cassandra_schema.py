"""What of the Cassandra adapter runs without a Cassandra server: replication parsing and its
setting, migration ordering and the lease protocol (two instances migrating at once), and the
page bridge that keeps reads off the event loop (against a stand-in for the driver's
ResponseFuture, which cannot be built without a server)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from typing import Any

import pytest
from pydantic import ValidationError

from services.common.config import ServiceSettings
from services.common.store import (
    cassandra_queue,
    cassandra_router,
    cassandra_session,
    cassandra_tokens,
)
from services.common.store.cassandra import MIGRATIONS as AUTH_MIGRATIONS
from services.common.store.cassandra import PageBridge
from services.common.store.cassandra_schema import (
    AddColumn,
    Migration,
    Step,
    check_migrations,
    migrate,
    parse_replication,
    pending,
    replication_cql,
    same_replication,
)


def test_replication_simple_and_per_data_centre() -> None:
    assert parse_replication("SimpleStrategy:1") == {
        "class": "SimpleStrategy",
        "replication_factor": 1,
    }
    assert parse_replication(" dc1:3, eu-west.2:5 ") == {
        "class": "NetworkTopologyStrategy",
        "dc1": 3,
        "eu-west.2": 5,
    }
    assert (
        replication_cql(parse_replication("dc1:3"))
        == "{'class': 'NetworkTopologyStrategy', 'dc1': '3'}"
    )


@pytest.mark.parametrize(
    "bad",
    ["", "dc1", "dc1:", "dc1:0", "dc1:99", "dc1:3,", "dc1:3,dc1:2", "SimpleStrategy:1,dc1:3",
     "dc1:3,SimpleStrategy:2", "bad name:3", "dc1:three", "x'y:3"],
)  # fmt: skip
def test_bad_replication_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_replication(bad)


def test_bad_replication_stops_start_up_naming_the_setting() -> None:
    with pytest.raises(ValidationError) as err:
        ServiceSettings(cassandra_replication="dc1:3,dc1:2")
    assert "cassandra_replication" in str(err.value)
    assert ServiceSettings(cassandra_replication="dc1:3,dc2:3").cassandra_replication


def test_existing_keyspace_replication_is_compared_as_cassandra_reports_it() -> None:
    reported = {"class": "org.apache.cassandra.locator.NetworkTopologyStrategy", "dc1": "3"}
    assert same_replication(parse_replication("dc1:3"), reported)
    assert not same_replication(parse_replication("dc1:3,dc2:3"), reported)
    assert not same_replication(parse_replication("SimpleStrategy:3"), reported)


def test_every_store_numbers_its_migrations_from_one_without_gaps() -> None:
    for migrations in (
        AUTH_MIGRATIONS,
        cassandra_queue.MIGRATIONS,
        cassandra_session.MIGRATIONS,
        cassandra_router.MIGRATIONS,
        cassandra_tokens.MIGRATIONS,
    ):
        check_migrations(migrations)
    # The queue's counters are compare-and-set on a version column added by a migration.
    steps = [s for m in cassandra_queue.MIGRATIONS for s in m.steps]
    assert AddColumn("queue_state", "version", "bigint") in steps
    with pytest.raises(ValueError):
        check_migrations([Migration(1, "a", ()), Migration(3, "c", ())])
    assert [m.version for m in pending(cassandra_queue.MIGRATIONS, 1)] == [2, 3, 4, 5, 6]


class SharedLedger:
    """The schema_version and schema_lock rows, as Cassandra's lightweight transactions
    treat them (atomic compare-and-set), shared by several migrating instances."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.version = 0
        self.holder: str | None = None
        self.applied: list[tuple[str, Step]] = []


class InstanceLedger:
    def __init__(self, shared: SharedLedger, name: str) -> None:
        self.s, self.name = shared, name

    def version(self) -> int:
        return self.s.version

    def try_lease(self) -> bool:
        with self.s.lock:
            if self.s.holder is None:
                self.s.holder = self.name
                return True
            return False

    def release_lease(self) -> None:
        with self.s.lock:
            if self.s.holder == self.name:
                self.s.holder = None

    def advance(self, from_version: int, to_version: int) -> bool:
        with self.s.lock:
            if self.s.version != from_version:
                return False
            self.s.version = to_version
            return True

    def run(self, step: Step) -> None:
        self.s.applied.append((self.name, step))
        time.sleep(0.01)  # a DDL statement takes a while: the other instance must wait

    def wait(self) -> None:
        time.sleep(0.005)


MIGS = [
    Migration(1, "tables", ("CREATE TABLE IF NOT EXISTS a (k int PRIMARY KEY)",)),
    Migration(2, "column", (AddColumn("a", "v", "text"),)),
    Migration(3, "index", ("CREATE TABLE IF NOT EXISTS b (k int PRIMARY KEY)",)),
]


def test_instances_migrating_at_once_apply_each_step_once_in_order() -> None:
    shared = SharedLedger()
    results: dict[str, int] = {}

    def start(name: str) -> None:
        results[name] = migrate(InstanceLedger(shared, name), MIGS, max_waits=1000)

    threads = [threading.Thread(target=start, args=(f"i{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {f"i{n}": 3 for n in range(4)}
    assert shared.version == 3 and shared.holder is None
    assert [step for _, step in shared.applied] == [s for m in MIGS for s in m.steps]
    assert len({name for name, _ in shared.applied}) == 1  # one instance did the work


def test_an_up_to_date_keyspace_runs_nothing_and_a_newer_one_only_the_rest() -> None:
    shared = SharedLedger()
    shared.version = 3
    assert migrate(InstanceLedger(shared, "x"), MIGS, max_waits=0) == 3
    assert shared.applied == []
    shared.version = 1
    assert migrate(InstanceLedger(shared, "x"), MIGS, max_waits=0) == 3
    assert [s for _, s in shared.applied] == [*MIGS[1].steps, *MIGS[2].steps]


def test_a_lease_held_elsewhere_too_long_stops_start_up() -> None:
    shared = SharedLedger()
    shared.holder = "crashed-instance"  # its TTL has not run out yet
    with pytest.raises(RuntimeError, match="lease held elsewhere"):
        migrate(InstanceLedger(shared, "x"), MIGS, max_waits=3)
    assert shared.version == 0


class StandInResponseFuture:
    """The part of the driver's ResponseFuture the bridge uses: callbacks from another
    thread, one per page, the next page only when asked for."""

    def __init__(self, pages: list[list[int]]) -> None:
        self.pages = pages
        self.index = 0
        self.asked = 0
        self._callbacks: tuple[Any, Any] | None = None

    def add_callbacks(self, callback: Any, errback: Any) -> None:
        self._callbacks = (callback, errback)
        self._deliver()

    @property
    def has_more_pages(self) -> bool:
        return self.index < len(self.pages) - 1

    def start_fetching_next_page(self) -> None:
        self.asked += 1
        self.index += 1
        self._deliver()

    def _deliver(self) -> None:
        assert self._callbacks is not None
        page, cb = self.pages[self.index], self._callbacks[0]
        threading.Timer(0.01, cb, args=(page,)).start()


async def test_pages_arrive_one_at_a_time_without_blocking_the_loop() -> None:
    rf = StandInResponseFuture([[1, 2], [3, 4], [5]])
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    tick = asyncio.create_task(ticker())
    seen: list[list[int]] = []
    async for page in PageBridge(rf):
        # The next page is only asked for once this one is taken.
        assert rf.asked == len(seen)
        seen.append(page)
    tick.cancel()
    assert seen == [[1, 2], [3, 4], [5]]
    assert ticks > 5  # the loop kept running while pages were fetched


async def test_a_failed_page_raises_in_the_reader() -> None:
    class Failing(StandInResponseFuture):
        def _deliver(self) -> None:
            assert self._callbacks is not None
            if self.index == 1:
                threading.Timer(0.01, self._callbacks[1], args=(OSError("node down"),)).start()
            else:
                super()._deliver()

    got: list[list[int]] = []
    with pytest.raises(OSError, match="node down"):
        async for page in PageBridge(Failing([[1], [2]])):
            got.append(page)
    assert got == [[1]]


class _Prepared:
    def __init__(self, query: str) -> None:
        self.query_string = query
        self.consistency_level: int | None = None


class _Recorder:
    """A session that only records what a store prepares."""

    keyspace = "ks"

    def __init__(self) -> None:
        self.queries: list[str] = []

    def prepare(self, query: str) -> _Prepared:
        self.queries.append(query)
        return _Prepared(query)


def test_no_row_takes_both_lightweight_transactions_and_plain_writes() -> None:
    """Cassandra orders a plain write by its client's timestamp and an LWT by its Paxos
    ballot: mixed on one row, a clear then a set can come out reversed (docs/storage.md,
    "One kind of write per row"). Every table a store writes takes one kind only."""
    from services.common.store import (
        cassandra,
        cassandra_bans,
        cassandra_rules,
        cassandra_usage,
    )

    stores = (
        cassandra.CassandraStore,
        cassandra_bans.CassandraBanStore,
        cassandra_router.CassandraRouterStore,
        cassandra_rules.CassandraRuleStore,
        cassandra_session.CassandraSessionStore,
        cassandra_tokens.CassandraTokenStore,
        cassandra_usage.CassandraUsageStore,
    )
    for cls in stores:
        rec = _Recorder()
        cls.on_session(rec, 0, object)
        kinds: dict[str, set[bool]] = {}
        for q in rec.queries:
            if not q.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")):
                continue
            found = re.search(r"(?:INTO|UPDATE|FROM)\s+(\w+)", q, re.I)
            assert found, q
            kinds.setdefault(found.group(1), set()).add(bool(re.search(r"\bIF\b", q)))
        mixed = sorted(t for t, k in kinds.items() if len(k) > 1)
        assert not mixed, f"{cls.__name__}: LWT and plain writes on {mixed}"
        assert kinds, cls.__name__
