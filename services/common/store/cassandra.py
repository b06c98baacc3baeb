"""Cassandra backend of the store interfaces (cassandra-driver): the connection, keyspace and
schema set-up shared by every Cassandra store, the bridge from driver futures to asyncio, and
`AuthStore` on Cassandra.

Keyspace `starling` with the replication of `cassandra_replication` (created if missing; an
existing keyspace with another replication is left alone and logged: changing it needs a
repair, an operator's job). Schema: versioned migrations per store (cassandra_schema.py).
Consistency: `cassandra_consistency` (LOCAL_QUORUM by default) for every read and write,
`cassandra_serial_consistency` (LOCAL_SERIAL) for the Paxos phase of lightweight transactions;
docs/storage.md lists them per operation. Token-aware routing over DC-aware round robin.
Reads never block the event loop: every page after the first is fetched from the driver's own
thread (`_pages`), never by iterating a ResultSet. The same contract tests as the embedded
store run against it when `STARLING_TEST_CASSANDRA=host:port` is set.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, Self

from services.common.acl import Access, AclRule
from services.common.store.cassandra_schema import (
    AddColumn,
    Migration,
    Step,
    migrate,
    parse_replication,
    replication_cql,
    same_replication,
)
from services.common.store.ports_auth import UserRecord

log = logging.getLogger("starling.store.cassandra")

FETCH_SIZE = 1000  # rows per page of a read
MIGRATION_LEASE_S = 120  # a crashed migrating instance blocks the others at most this long
MIGRATION_WAITS = 240  # one second each: how long an instance waits for another's migration

MIGRATIONS = [
    Migration(
        1,
        "users and acls",
        (
            """CREATE TABLE IF NOT EXISTS users (
                 tenant text, username text, password_hash text,
                 PRIMARY KEY ((tenant), username))""",
            """CREATE TABLE IF NOT EXISTS acls (
                 tenant text, idx int, allow boolean, access int, topic_filter text,
                 username text, client_id text,
                 PRIMARY KEY ((tenant), idx))""",
        ),
    ),
    # One partition per user: a tenant's users in one partition grew without bound (a
    # tenant with a million device credentials). `users` is still read for rows written
    # before, and deleted from; never written.
    Migration(
        2,
        "users by name",
        (
            """CREATE TABLE IF NOT EXISTS users_by_name (
                 tenant text, username text, password_hash text,
                 PRIMARY KEY ((tenant, username)))""",
        ),
    ),
]

_LEDGER_TABLES = (
    "CREATE TABLE IF NOT EXISTS schema_version (component text PRIMARY KEY, version int)",
    "CREATE TABLE IF NOT EXISTS schema_lock (component text PRIMARY KEY, holder text)",
)


class PageBridge:
    """The pages of one driver `ResponseFuture`, as an async iterator on the running loop.

    The driver calls back from its I/O thread with each page; the next page is asked for
    (`start_fetching_next_page`) only once the consumer took the previous one, so memory
    holds one page and nothing ever blocks the event loop."""

    def __init__(self, rf: Any) -> None:
        self._rf = rf
        self._loop = asyncio.get_running_loop()
        self._pages: asyncio.Queue[tuple[list[Any] | None, BaseException | None]]
        self._pages = asyncio.Queue()
        rf.add_callbacks(self._on_page, self._on_error)

    def _on_page(self, rows: Any) -> None:
        self._loop.call_soon_threadsafe(self._pages.put_nowait, (list(rows or ()), None))

    def _on_error(self, exc: BaseException) -> None:
        self._loop.call_soon_threadsafe(self._pages.put_nowait, (None, exc))

    def __aiter__(self) -> AsyncIterator[list[Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[list[Any]]:
        while True:
            rows, exc = await self._pages.get()
            if exc is not None:
                raise exc
            assert rows is not None
            yield rows
            if not self._rf.has_more_pages:
                return
            self._rf.start_fetching_next_page()


def _future(rf: Any) -> asyncio.Future[Any]:
    """Bridge a driver ResponseFuture (one page: a batch or a single statement) to an asyncio
    future on the running loop."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(rows: Any = None, exc: BaseException | None = None) -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(rows)

    def ok(rows: Any) -> None:
        loop.call_soon_threadsafe(settle, rows)

    def err(exc: BaseException) -> None:
        loop.call_soon_threadsafe(settle, None, exc)

    rf.add_callbacks(ok, err)
    return fut


class _CqlLedger:
    """`Ledger` of one component on the schema_version and schema_lock tables."""

    def __init__(self, base: CassandraBase, component: str) -> None:
        self._base = base
        self._s = base._session
        self._component = component
        self._me = uuid.uuid4().hex

    def version(self) -> int:
        rows = list(
            self._s.execute(
                "SELECT version FROM schema_version WHERE component=%s", (self._component,)
            ).current_rows
        )
        return int(rows[0].version) if rows else 0

    def try_lease(self) -> bool:
        return bool(
            self._s.execute(
                "INSERT INTO schema_lock (component, holder) VALUES (%s, %s) IF NOT EXISTS "
                f"USING TTL {MIGRATION_LEASE_S}",
                (self._component, self._me),
            ).was_applied
        )

    def release_lease(self) -> None:
        self._s.execute(
            "DELETE FROM schema_lock WHERE component=%s IF holder=%s", (self._component, self._me)
        )

    def advance(self, from_version: int, to_version: int) -> bool:
        if from_version == 0:
            stmt = "INSERT INTO schema_version (component, version) VALUES (%s, %s) IF NOT EXISTS"
            return bool(self._s.execute(stmt, (self._component, to_version)).was_applied)
        return bool(
            self._s.execute(
                "UPDATE schema_version SET version=%s WHERE component=%s IF version=%s",
                (to_version, self._component, from_version),
            ).was_applied
        )

    def run(self, step: Step) -> None:
        if isinstance(step, AddColumn):
            self._base.add_column(step)
        else:
            self._s.execute(step)

    def wait(self) -> None:
        time.sleep(1.0)


class CassandraBase:
    """Cluster, keyspace and schema set-up shared by the Cassandra stores (see the module
    docstring); subclasses name their `component` and its `migrations`."""

    component = "auth"
    migrations: Sequence[Migration] = ()

    def __init__(
        self,
        *,
        contact_points: list[str],
        port: int = 9042,
        keyspace: str = "starling",
        replication: str = "SimpleStrategy:1",
        consistency: str = "LOCAL_QUORUM",
        serial_consistency: str = "LOCAL_SERIAL",
    ) -> None:
        from cassandra import ConsistencyLevel
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

        wanted = parse_replication(replication)
        # For reads that must see every committed lightweight transaction (linearizable).
        self._serial_cl = getattr(ConsistencyLevel, serial_consistency)
        profile = ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
            consistency_level=getattr(ConsistencyLevel, consistency),
            serial_consistency_level=getattr(ConsistencyLevel, serial_consistency),
        )
        self._cluster = Cluster(
            contact_points, port=port, execution_profiles={EXEC_PROFILE_DEFAULT: profile}
        )
        self._session = self._cluster.connect()
        self._session.default_fetch_size = FETCH_SIZE
        self._session.execute(
            f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication_cql(wanted)}"
        )
        self._check_replication(keyspace, wanted)
        self._session.set_keyspace(keyspace)
        for stmt in _LEDGER_TABLES:
            self._session.execute(stmt)
        version = migrate(_CqlLedger(self, self.component), self.migrations, MIGRATION_WAITS)
        log.info("cassandra_schema", extra={"component": self.component, "version": version})
        self._batch_type: Any = None  # cassandra.query.BatchStatement
        self.prepare()

    @classmethod
    def on_session(cls, session: Any, serial_consistency_level: int, batch_type: Any) -> Self:
        """A store on a session someone else opened, whose keyspace has the schema already
        (tests/simulation runs the stores on a model of Cassandra this way): no cluster of its
        own, nothing migrated. `batch_type` makes the batches (BatchStatement's interface)."""
        self = cls.__new__(cls)
        self._cluster = None
        self._session = session
        self._serial_cl = serial_consistency_level
        self._batch_type = batch_type
        self.prepare()
        return self

    def _batch(self, parts: Sequence[tuple[Any, tuple[Any, ...]]]) -> Any:
        """A batch of prepared statements with their values (one partition when any of them
        has an IF: Cassandra refuses a conditional batch over several)."""
        if self._batch_type is None:
            from cassandra.query import BatchStatement

            batch = BatchStatement()
        else:
            batch = self._batch_type()
        for stmt, args in parts:
            batch.add(stmt, args)
        return batch

    def _check_replication(self, keyspace: str, wanted: dict[str, str | int]) -> None:
        rows = list(
            self._session.execute(
                "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name=%s",
                (keyspace,),
            ).current_rows
        )
        if rows and not same_replication(wanted, dict(rows[0].replication)):
            log.warning(
                "cassandra_replication_differs",
                extra={
                    "setting": "cassandra_replication",
                    "configured": replication_cql(wanted),
                    "keyspace": dict(rows[0].replication),
                },
            )

    def columns(self, table: str) -> set[str]:
        """The columns `table` has in this keyspace now."""
        rows = self._session.execute(
            "SELECT column_name FROM system_schema.columns "
            "WHERE keyspace_name=%s AND table_name=%s",
            (self._session.keyspace, table),
        ).current_rows
        return {r.column_name for r in rows}

    def add_column(self, step: AddColumn) -> None:
        """ALTER TABLE ADD unless the column is there (or another instance just added it)."""
        from cassandra import InvalidRequest

        if step.column in self.columns(step.table):
            return
        try:
            self._session.execute(f"ALTER TABLE {step.table} ADD {step.column} {step.cql_type}")
        except InvalidRequest:
            if step.column not in self.columns(step.table):
                raise

    def prepare(self) -> None:
        """Prepare the store's statements (subclasses)."""

    async def _pages(self, stmt: Any, args: tuple[Any, ...] = ()) -> AsyncIterator[list[Any]]:
        """The result of a read page by page, each fetched off the event loop: the one way
        every read that can span pages goes."""
        async for page in PageBridge(self._session.execute_async(stmt, args)):
            yield page

    async def _exec(self, stmt: Any, args: tuple[Any, ...] = ()) -> list[Any]:
        """Run a statement; every row of its result (all pages)."""
        out: list[Any] = []
        async for page in self._pages(stmt, args):
            out += page
        return out

    async def close(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()


class CassandraStore(CassandraBase):
    """`AuthStore` on Cassandra."""

    component = "auth"
    migrations = MIGRATIONS

    def prepare(self) -> None:
        p = self._session.prepare
        self._get_user = p("SELECT password_hash FROM users_by_name WHERE tenant=? AND username=?")
        self._get_old_user = p("SELECT password_hash FROM users WHERE tenant=? AND username=?")
        self._put_user = p(
            "INSERT INTO users_by_name (tenant, username, password_hash) VALUES (?, ?, ?)"
        )
        # Plain writes only on users (no LWT: it would be ordered by another clock than the
        # plain inserts, so a delete then a put could come out deleted).
        self._del_user = p("DELETE FROM users_by_name WHERE tenant=? AND username=?")
        self._del_old_user = p("DELETE FROM users WHERE tenant=? AND username=?")
        self._get_acl = p(
            "SELECT allow, access, topic_filter, username, client_id FROM acls WHERE tenant=?"
        )
        # Same-partition batch: the delete gets an older timestamp than the inserts, else the
        # tombstone would shadow rows written at the same timestamp.
        self._del_acl = p("DELETE FROM acls USING TIMESTAMP ? WHERE tenant=?")
        self._put_acl = p(
            "INSERT INTO acls (tenant, idx, allow, access, topic_filter, username, client_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?"
        )

    async def get_user(self, tenant: str, username: str) -> UserRecord | None:
        rows = list(await self._exec(self._get_user, (tenant, username)))
        if not rows:  # a user stored before migration 2
            rows = list(await self._exec(self._get_old_user, (tenant, username)))
        return UserRecord(tenant, username, rows[0].password_hash) if rows else None

    async def put_user(self, user: UserRecord) -> None:
        await self._exec(self._put_user, (user.tenant, user.username, user.password_hash))

    async def delete_user(self, tenant: str, username: str) -> bool:
        if await self.get_user(tenant, username) is None:
            return False
        await self._exec(self._del_user, (tenant, username))
        await self._exec(self._del_old_user, (tenant, username))
        return True

    async def get_acl(self, tenant: str) -> list[AclRule]:
        rows = await self._exec(self._get_acl, (tenant,))
        return [
            AclRule(r.allow, Access(r.access), r.topic_filter, r.username, r.client_id)
            for r in rows
        ]

    async def set_acl(self, tenant: str, rules: list[AclRule]) -> None:
        from cassandra.query import BatchStatement

        ts = int(time.time() * 1_000_000)
        batch = BatchStatement()
        batch.add(self._del_acl, (ts - 1, tenant))
        for i, r in enumerate(rules):
            batch.add(
                self._put_acl,
                (tenant, i, r.allow, int(r.access), r.topic_filter, r.username, r.client_id, ts),
            )
        await _future(self._session.execute_async(batch))
