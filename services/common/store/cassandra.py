"""Cassandra backend of the store interfaces (cassandra-driver).

Keyspace `starling` (replication chosen per deployment), schema created or migrated at start,
prepared statements, token-aware routing, LOCAL_QUORUM by default. The same contract tests as
the embedded store run against it when `STARLING_TEST_CASSANDRA=host:port` is set.
"""

from __future__ import annotations

import asyncio
from typing import Any

from services.common.acl import Access, AclRule
from services.common.store.ports import UserRecord

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS users (
         tenant text, username text, password_hash text,
         PRIMARY KEY ((tenant), username))""",
    """CREATE TABLE IF NOT EXISTS acls (
         tenant text, idx int, allow boolean, access int, topic_filter text,
         username text, client_id text,
         PRIMARY KEY ((tenant), idx))""",
]


def _future(rf: Any) -> asyncio.Future[Any]:
    """Bridge a driver ResponseFuture to an asyncio future on the running loop."""
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


class CassandraBase:
    """Cluster, keyspace and schema set-up shared by the Cassandra stores.

    Token-aware routing over DC-aware round robin; `consistency` (LOCAL_QUORUM by default)
    for every statement; the schema is created or migrated (IF NOT EXISTS) at start.
    """

    schema: list[str] = []

    def __init__(
        self,
        contact_points: list[str],
        port: int = 9042,
        keyspace: str = "starling",
        replication: str = "{'class': 'SimpleStrategy', 'replication_factor': 1}",
        consistency: str = "LOCAL_QUORUM",
    ) -> None:
        from cassandra import ConsistencyLevel
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

        profile = ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy()),
            consistency_level=getattr(ConsistencyLevel, consistency),
            serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
        )
        self._cluster = Cluster(
            contact_points, port=port, execution_profiles={EXEC_PROFILE_DEFAULT: profile}
        )
        self._session = self._cluster.connect()
        self._session.execute(
            f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {replication}"
        )
        self._session.set_keyspace(keyspace)
        for stmt in self.schema:
            self._session.execute(stmt)
        self.migrate()
        self.prepare()

    def migrate(self) -> None:
        """Bring tables created by an older version up to `schema` (subclasses)."""

    def columns(self, table: str) -> set[str]:
        """The columns `table` has in this keyspace now."""
        rows = self._session.execute(
            "SELECT column_name FROM system_schema.columns "
            "WHERE keyspace_name=%s AND table_name=%s",
            (self._session.keyspace, table),
        )
        return {r.column_name for r in rows}

    def prepare(self) -> None:
        """Prepare the store's statements (subclasses)."""

    async def _exec(self, stmt: Any, args: tuple[Any, ...] = ()) -> Any:
        return await _future(self._session.execute_async(stmt, args))

    async def close(self) -> None:
        self._cluster.shutdown()


class CassandraStore(CassandraBase):
    """`AuthStore` on Cassandra."""

    schema = SCHEMA

    def prepare(self) -> None:
        p = self._session.prepare
        self._get_user = p("SELECT password_hash FROM users WHERE tenant=? AND username=?")
        self._put_user = p("INSERT INTO users (tenant, username, password_hash) VALUES (?, ?, ?)")
        self._del_user = p("DELETE FROM users WHERE tenant=? AND username=? IF EXISTS")
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
        return UserRecord(tenant, username, rows[0].password_hash) if rows else None

    async def put_user(self, user: UserRecord) -> None:
        await self._exec(self._put_user, (user.tenant, user.username, user.password_hash))

    async def delete_user(self, tenant: str, username: str) -> bool:
        rows = list(await self._exec(self._del_user, (tenant, username)))
        return bool(rows and rows[0][0])

    async def get_acl(self, tenant: str) -> list[AclRule]:
        rows = await self._exec(self._get_acl, (tenant,))
        return [
            AclRule(r.allow, Access(r.access), r.topic_filter, r.username, r.client_id)
            for r in rows
        ]

    async def set_acl(self, tenant: str, rules: list[AclRule]) -> None:
        import time

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
