"""Cassandra `SessionStore`: session records, an expiry index and persistent subscriptions.

sessions ((tenant, client_id)) with the session's owner (null: unknown, for rows written
before owners were stored; the column is added to older keyspaces by migration 2);
session_expiry ((shard), expires_at_ms, tenant, client_id) so expired sessions are found per
shard in time order without a full scan;
subscriptions ((tenant, client_id, incarnation), topic_filter);
inbound_qos2 ((tenant, client_id, incarnation), packet_id): QoS 2 publishes awaiting PUBREL,
whose changes are checked against sessions.qos2_fence (migration 6) as they are written: the
check and the write are two statements, so a late change of an earlier connection read
against the old fence in the milliseconds before a new connection raised it can still land
(a lightweight transaction per change would close that, at four round trips each);
the event log and routing snapshots (cassandra_eventlog.py, migration 4): a subscription
change and its log rows go in one logged batch, so the log holds every durable change.
"""

from __future__ import annotations

import zlib
from typing import Any

from services.common.store.cassandra_eventlog import (
    CHAIN_MIGRATION,
    INDEX_MIGRATION,
    CassandraEventLog,
)
from services.common.store.cassandra_eventlog import MIGRATION as LOG_MIGRATION
from services.common.store.cassandra_schema import AddColumn, Migration
from services.common.store.eventlog import EventKind, LogEvent, subscribed
from services.common.store.ports import (
    InboundQos2,
    Qos2Change,
    Qos2Update,
    SessionRecord,
    SubscriptionRecord,
)

SHARDS = 16

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
]


def _shard(tenant: str, client_id: str) -> int:
    return zlib.crc32(f"{tenant}/{client_id}".encode()) % SHARDS


class CassandraSessionStore(CassandraEventLog):
    component = "session"
    migrations = MIGRATIONS

    def prepare(self) -> None:
        self.prepare_log()
        p = self._session.prepare
        self._get = p(
            "SELECT incarnation, expiry_interval_s, connected, disconnected_at_ms, "
            "expires_at_ms, owner, qos2_fence FROM sessions WHERE tenant=? AND client_id=?"
        )
        self._put = p(
            "INSERT INTO sessions (tenant, client_id, incarnation, expiry_interval_s, "
            "connected, disconnected_at_ms, expires_at_ms, owner, qos2_fence) "
            "VALUES (?,?,?,?,?,?,?,?,?)"
        )
        self._del = p("DELETE FROM sessions WHERE tenant=? AND client_id=? IF incarnation=?")
        # Compare-and-set of a session record (lightweight transactions, SERIAL): see
        # `replace_session`.
        self._cas_new = p(
            "INSERT INTO sessions (tenant, client_id, incarnation, expiry_interval_s, "
            "connected, disconnected_at_ms, expires_at_ms, owner, qos2_fence) "
            "VALUES (?,?,?,?,?,?,?,?,?) IF NOT EXISTS"
        )
        cas_set = (
            "UPDATE sessions SET incarnation=?, expiry_interval_s=?, connected=?, "
            "disconnected_at_ms=?, expires_at_ms=?, owner=?, qos2_fence=? "
            "WHERE tenant=? AND client_id=? IF incarnation=? AND connected=? "
            "AND expiry_interval_s=? AND disconnected_at_ms=?"
        )
        self._cas_set = p(cas_set)
        self._cas_set_fenced = p(cas_set + " AND qos2_fence=?")
        self._idx_put = p(
            "INSERT INTO session_expiry (shard, expires_at_ms, tenant, client_id) VALUES (?,?,?,?)"
        )
        self._idx_del = p(
            "DELETE FROM session_expiry WHERE shard=? AND expires_at_ms=? AND "
            "tenant=? AND client_id=?"
        )
        self._idx_scan = p(
            "SELECT expires_at_ms, tenant, client_id FROM session_expiry "
            "WHERE shard=? AND expires_at_ms<=? LIMIT ?"
        )
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
        if not rows:
            return None
        r = rows[0]
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

    async def put_session(self, r: SessionRecord) -> None:
        old = list(await self._exec(self._get, (r.tenant, r.client_id)))
        shard = _shard(r.tenant, r.client_id)
        if old and old[0].expires_at_ms is not None:
            await self._exec(self._idx_del, (shard, old[0].expires_at_ms, r.tenant, r.client_id))
        expires = r.expires_at_ms()
        await self._exec(
            self._put,
            (
                r.tenant,
                r.client_id,
                r.incarnation,
                r.expiry_interval_s,
                r.connected,
                r.disconnected_at_ms,
                expires,
                r.owner,
                r.qos2_fence,
            ),
        )
        if expires is not None:
            await self._exec(self._idx_put, (shard, expires, r.tenant, r.client_id))

    async def replace_session(self, r: SessionRecord, expect: SessionRecord | None) -> bool:
        values = (
            r.incarnation,
            r.expiry_interval_s,
            r.connected,
            r.disconnected_at_ms,
            r.expires_at_ms(),
            r.owner,
            r.qos2_fence,
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
        # The expiry index follows the record that won (a lost race changed nothing).
        shard = _shard(r.tenant, r.client_id)
        before = expect.expires_at_ms() if expect is not None else None
        after = r.expires_at_ms()
        if before is not None and before != after:
            await self._exec(self._idx_del, (shard, before, r.tenant, r.client_id))
        if after is not None:
            await self._exec(self._idx_put, (shard, after, r.tenant, r.client_id))
        return True

    async def delete_session(self, tenant: str, client_id: str, incarnation: int) -> bool:
        old = list(await self._exec(self._get, (tenant, client_id)))
        rows = list(await self._exec(self._del, (tenant, client_id, incarnation)))
        applied = bool(rows and rows[0][0])
        if applied and old and old[0].expires_at_ms is not None:
            await self._exec(
                self._idx_del, (_shard(tenant, client_id), old[0].expires_at_ms, tenant, client_id)
            )
        return applied

    async def expired_sessions(self, now_ms: int, limit: int = 1000) -> list[SessionRecord]:
        out: list[SessionRecord] = []
        for shard in range(SHARDS):
            for row in await self._exec(self._idx_scan, (shard, now_ms, limit)):
                rec = await self.get_session(row.tenant, row.client_id)
                if rec is not None and (rec.expires_at_ms() or now_ms + 1) <= now_ms:
                    out.append(rec)
                else:  # stale index row
                    await self._exec(
                        self._idx_del, (shard, row.expires_at_ms, row.tenant, row.client_id)
                    )
            if len(out) >= limit:
                break
        return out[:limit]

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
