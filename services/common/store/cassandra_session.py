"""Cassandra `SessionStore`: session records, an expiry index and persistent subscriptions.

sessions ((tenant, client_id)) with the session's owner (null: unknown, for rows written
before owners were stored; the column is added to older keyspaces by migration 2);
the expiry index in minute buckets (cassandra_session_expiry.py, migration 8), so expired
sessions are found without a full scan or a read through earlier sweeps' tombstones;
each tenant's parked sessions by client id (cassandra_session_index.py, migration 9);
subscriptions ((tenant, client_id, incarnation), topic_filter);
inbound_qos2 ((tenant, client_id, incarnation), packet_id): QoS 2 publishes awaiting PUBREL,
whose changes are checked against sessions.qos2_fence (migration 6) as they are written: the
check and the write are two statements, so a late change of an earlier connection read
against the old fence in the milliseconds before a new connection raised it can still land
(a lightweight transaction per change would close that, at four round trips each);
the event log and routing snapshots (cassandra_eventlog.py, migration 4): a subscription
change and its log rows go in one logged batch, so the log holds every durable change.

A session row takes only lightweight transactions (`replace_session`, `delete_session`, and
`put_session` as a read at SERIAL then a compare-and-set): a plain write and an LWT on one row
are ordered by different clocks, so mixing them could undo a later decision.
"""

from __future__ import annotations

from typing import Any

from services.common.store.cassandra_eventlog import (
    CHAIN_MIGRATION,
    INDEX_MIGRATION,
    CassandraEventLog,
)
from services.common.store.cassandra_eventlog import MIGRATION as LOG_MIGRATION
from services.common.store.cassandra_schema import AddColumn, Migration
from services.common.store.cassandra_session_expiry import MIGRATION as EXPIRY_MIGRATION
from services.common.store.cassandra_session_expiry import NOT_YET, Due, ExpiryIndex
from services.common.store.cassandra_session_index import MIGRATION as TENANT_MIGRATION
from services.common.store.cassandra_session_index import TenantIndex
from services.common.store.eventlog import EventKind, LogEvent, subscribed
from services.common.store.ports_session import (
    InboundQos2,
    Qos2Change,
    Qos2Update,
    SessionRecord,
    SubscriptionRecord,
)

MIGRATIONS = [
    Migration(
        1,
        "sessions, expiry index, subscriptions",
        (
            """CREATE TABLE IF NOT EXISTS sessions (
             tenant text, client_id text, incarnation bigint, expiry_interval_s bigint,
             connected boolean, disconnected_at_ms bigint, expires_at_ms bigint, owner text,
             PRIMARY KEY ((tenant, client_id)))""",
            """CREATE TABLE IF NOT EXISTS session_expiry (
             shard int, expires_at_ms bigint, tenant text, client_id text,
             PRIMARY KEY ((shard), expires_at_ms, tenant, client_id))""",
            """CREATE TABLE IF NOT EXISTS subscriptions (
             tenant text, client_id text, incarnation bigint, topic_filter text, qos int,
             no_local boolean, retain_as_published boolean, retain_handling int,
             subscription_identifier int,
             PRIMARY KEY ((tenant, client_id, incarnation), topic_filter))""",
        ),
    ),
    # Keyspaces created before sessions had owners lack the column.
    Migration(2, "sessions.owner", (AddColumn("sessions", "owner", "text"),)),
    Migration(
        3,
        "inbound QoS 2 state",
        (
            """CREATE TABLE IF NOT EXISTS inbound_qos2 (
             tenant text, client_id text, incarnation bigint, packet_id int,
             message_id text, stored boolean,
             PRIMARY KEY ((tenant, client_id, incarnation), packet_id))""",
        ),
    ),
    LOG_MIGRATION,
    CHAIN_MIGRATION,
    Migration(6, "sessions.qos2_fence", (AddColumn("sessions", "qos2_fence", "bigint"),)),
    INDEX_MIGRATION,
    EXPIRY_MIGRATION,
    TENANT_MIGRATION,
]
_PUT_ATTEMPTS = 8
_GET = (
    "SELECT incarnation, expiry_interval_s, connected, disconnected_at_ms, expires_at_ms, "
    "owner, qos2_fence, expiry_due_ms FROM sessions WHERE tenant=? AND client_id=?"
)


class CassandraSessionStore(CassandraEventLog):
    component = "session"
    migrations = MIGRATIONS

    def prepare(self) -> None:
        self.prepare_log()
        p = self._session.prepare
        self._get = p(_GET)
        self._get_serial = p(_GET)
        self._get_serial.consistency_level = self._serial_cl
        self._del = p("DELETE FROM sessions WHERE tenant=? AND client_id=? IF incarnation=?")
        # Compare-and-set of a session record (lightweight transactions, SERIAL): see
        # `replace_session`.
        self._cas_new = p(
            "INSERT INTO sessions (tenant, client_id, incarnation, expiry_interval_s, "
            "connected, disconnected_at_ms, expires_at_ms, owner, qos2_fence, expiry_due_ms) "
            "VALUES (?,?,?,?,?,?,?,?,?,?) IF NOT EXISTS"
        )
        cas_set = (
            "UPDATE sessions SET incarnation=?, expiry_interval_s=?, connected=?, "
            "disconnected_at_ms=?, expires_at_ms=?, owner=?, qos2_fence=?, expiry_due_ms=? "
            "WHERE tenant=? AND client_id=? IF incarnation=? AND connected=? "
            "AND expiry_interval_s=? AND disconnected_at_ms=?"
        )
        self._cas_set = p(cas_set)
        self._cas_set_fenced = p(cas_set + " AND qos2_fence=?")
        self._expiry = ExpiryIndex(prepare=p, run=self._exec)
        self._tenants = TenantIndex(prepare=p, run=self._exec)
        self._prepare_subscriptions()

    def _prepare_subscriptions(self) -> None:
        """The statements of persistent subscriptions and inbound QoS 2 state."""
        p = self._session.prepare
        self._sub_put = p(
            "INSERT INTO subscriptions (tenant, client_id, incarnation, "
            "topic_filter, qos, no_local, retain_as_published, retain_handling, "
            "subscription_identifier) VALUES (?,?,?,?,?,?,?,?,?)"
        )
        self._sub_del = p(
            "DELETE FROM subscriptions WHERE tenant=? AND client_id=? AND "
            "incarnation=? AND topic_filter=?"
        )
        self._sub_list = p(
            "SELECT * FROM subscriptions WHERE tenant=? AND client_id=? AND incarnation=?"
        )
        self._sub_drop = p(
            "DELETE FROM subscriptions WHERE tenant=? AND client_id=? AND incarnation=?"
        )
        self._sub_all = p("SELECT * FROM subscriptions")
        self._q2_put = p(
            "INSERT INTO inbound_qos2 (tenant, client_id, incarnation, packet_id, message_id, "
            "stored) VALUES (?,?,?,?,?,?)"
        )
        self._q2_del = p(
            "DELETE FROM inbound_qos2 WHERE tenant=? AND client_id=? AND incarnation=? "
            "AND packet_id=?"
        )
        self._q2_list = p(
            "SELECT packet_id, message_id, stored FROM inbound_qos2 WHERE tenant=? AND "
            "client_id=? AND incarnation=?"
        )
        self._q2_drop = p(
            "DELETE FROM inbound_qos2 WHERE tenant=? AND client_id=? AND incarnation=?"
        )

    async def get_session(self, tenant: str, client_id: str) -> SessionRecord | None:
        rows = list(await self._exec(self._get, (tenant, client_id)))
        return self._record(tenant, client_id, rows[0]) if rows else None

    async def put_session(self, r: SessionRecord) -> None:
        # A compare-and-set against what a SERIAL read saw (never a plain write: see the
        # module docstring); another writer in between means read and try again.
        for _ in range(_PUT_ATTEMPTS):
            rows = list(await self._exec(self._get_serial, (r.tenant, r.client_id)))
            current = self._record(r.tenant, r.client_id, rows[0]) if rows else None
            if await self.replace_session(r, current):
                return
        raise RuntimeError(f"session {r.tenant}/{r.client_id} kept changing under put_session")

    @staticmethod
    def _record(tenant: str, client_id: str, r: Any) -> SessionRecord:
        return SessionRecord(
            tenant,
            client_id,
            r.incarnation,
            r.expiry_interval_s,
            r.connected,
            r.disconnected_at_ms,
            r.owner,
            r.qos2_fence or 0,
        )

    async def replace_session(self, r: SessionRecord, expect: SessionRecord | None) -> bool:
        after = r.expires_at_ms()
        due = self._expiry.due_at(after)
        values = (
            r.incarnation,
            r.expiry_interval_s,
            r.connected,
            r.disconnected_at_ms,
            after,
            r.owner,
            r.qos2_fence,
            due,
        )
        if expect is None:
            rows = list(await self._exec(self._cas_new, (r.tenant, r.client_id, *values)))
        else:
            cond: tuple[int | bool, ...] = (
                expect.incarnation,
                expect.connected,
                expect.expiry_interval_s,
                expect.disconnected_at_ms,
            )
            # A row written before migration 6 has no fence (read as 0): the condition then
            # leaves the fence out, as `IF qos2_fence = 0` would never hold for a null.
            if expect.qos2_fence:
                stmt, cond = self._cas_set_fenced, (*cond, expect.qos2_fence)
            else:
                stmt = self._cas_set
            rows = list(await self._exec(stmt, (*values, r.tenant, r.client_id, *cond)))
        if not (rows and rows[0][0]):  # [applied]
            return False
        # The expiry index follows the record that won (a lost race changed nothing). The
        # previous row is deleted at its expiry; one written already due (at the writer's
        # clock instead) is found stale and deleted by the sweep.
        before = expect.expires_at_ms() if expect is not None else None
        if before is not None and before != due:
            await self._expiry.remove(r.tenant, r.client_id, before)
        if due is not None:
            await self._expiry.add(r.tenant, r.client_id, due)
        await self._tenants.written(r)
        return True

    async def delete_session(self, tenant: str, client_id: str, incarnation: int) -> bool:
        old = list(await self._exec(self._get, (tenant, client_id)))
        rows = list(await self._exec(self._del, (tenant, client_id, incarnation)))
        applied = bool(rows and rows[0][0])
        if applied:
            await self._tenants.deleted(tenant, client_id)
        if applied and old and old[0].expires_at_ms is not None:
            due = old[0].expiry_due_ms
            await self._expiry.remove(
                tenant, client_id, old[0].expires_at_ms if due is None else due
            )
        return applied

    async def offline_sessions(
        self, tenant: str, *, after: str, prefix: str, limit: int
    ) -> list[SessionRecord]:
        return await self._tenants.page(
            tenant, after=after, prefix=prefix, limit=limit, get=self.get_session
        )

    async def expired_sessions(self, now_ms: int, limit: int = 1000) -> list[SessionRecord]:
        async def check(row: Due) -> Any:
            rows = list(await self._exec(self._get, (row.tenant, row.client_id)))
            if not rows:
                return None  # gone
            r = rows[0]
            indexed = r.expires_at_ms if row.legacy or r.expiry_due_ms is None else r.expiry_due_ms
            if r.expires_at_ms is None or indexed != row.due_ms:
                return None  # resumed, or changed and indexed elsewhere
            if r.expires_at_ms > now_ms:
                return NOT_YET
            return self._record(row.tenant, row.client_id, r)

        return await self._expiry.due(now_ms, limit, check)

    async def put_subscriptions(self, subs: list[SubscriptionRecord]) -> int:
        statements, last = await self.log_statements([subscribed(s) for s in subs])
        for s in subs:
            args = (
                s.tenant,
                s.client_id,
                s.incarnation,
                s.topic_filter,
                s.qos,
                s.no_local,
                s.retain_as_published,
                s.retain_handling,
                s.subscription_identifier,
            )
            statements.append((self._sub_put, args))
        if subs:
            await self.run_batch(statements)
        return last

    async def delete_subscriptions(
        self, tenant: str, client_id: str, incarnation: int, filters: list[str]
    ) -> int:
        events = [
            LogEvent(tenant, EventKind.UNSUBSCRIBED, client_id, incarnation, f) for f in filters
        ]
        statements, last = await self.log_statements(events)
        statements += [(self._sub_del, (tenant, client_id, incarnation, f)) for f in filters]
        if filters:
            await self.run_batch(statements)
        return last

    @staticmethod
    def _rec(r: Any) -> SubscriptionRecord:
        return SubscriptionRecord(
            r.tenant,
            r.client_id,
            r.incarnation,
            r.topic_filter,
            r.qos,
            r.no_local,
            r.retain_as_published,
            r.retain_handling,
            r.subscription_identifier,
        )

    async def list_subscriptions(
        self, tenant: str, client_id: str, incarnation: int
    ) -> list[SubscriptionRecord]:
        rows = await self._exec(self._sub_list, (tenant, client_id, incarnation))
        return [self._rec(r) for r in rows]

    async def all_subscriptions(self) -> list[SubscriptionRecord]:
        # Every page, each fetched off the event loop; this runs once, when a router starts.
        return [self._rec(r) for r in await self._exec(self._sub_all)]

    async def subscriptions_as_of(self) -> tuple[int, list[SubscriptionRecord]]:
        # The stable position before the scan: every change at or below it is in the rows
        # read; later ones may be too, and replaying them again sets the same rows.
        position = await self.stable_position()
        return position, await self.all_subscriptions()

    async def drop_subscriptions(self, tenant: str, client_id: str, incarnation: int) -> int:
        event = LogEvent(tenant, EventKind.SESSION_DROPPED, client_id, incarnation)
        statements, last = await self.log_statements([event])
        statements.append((self._sub_drop, (tenant, client_id, incarnation)))
        await self.run_batch(statements)
        return last

    async def record_qos2(self, updates: list[Qos2Update]) -> None:
        # In order, one statement each. A STORED is an upsert of the same row: the node sends
        # it only for ids still awaiting PUBREL, after their RECEIVED. A RECEIVED or RELEASED
        # of an earlier connection than the one that last opened the session, or of an
        # incarnation that ended, is dropped (the session record read once per batch).
        records: dict[tuple[str, str], tuple[int, int] | None] = {}
        for u in updates:
            if u.fence and u.change != Qos2Change.STORED:
                key2 = (u.tenant, u.client_id)
                if key2 not in records:
                    rows = list(await self._exec(self._get, key2))
                    records[key2] = (rows[0].incarnation, rows[0].qos2_fence or 0) if rows else None
                rec = records[key2]
                if rec is None or rec[0] != u.incarnation or u.fence < rec[1]:
                    continue
            key = (u.tenant, u.client_id, u.incarnation, u.packet_id)
            if u.change == Qos2Change.RELEASED:
                await self._exec(self._q2_del, key)
            else:
                stored = u.change == Qos2Change.STORED
                await self._exec(self._q2_put, (*key, u.message_id, stored))

    async def list_qos2(self, tenant: str, client_id: str, incarnation: int) -> list[InboundQos2]:
        rows = await self._exec(self._q2_list, (tenant, client_id, incarnation))
        return [InboundQos2(r.packet_id, r.message_id, bool(r.stored)) for r in rows]

    async def drop_qos2(self, tenant: str, client_id: str, incarnation: int) -> None:
        await self._exec(self._q2_drop, (tenant, client_id, incarnation))
