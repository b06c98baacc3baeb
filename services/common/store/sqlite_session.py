"""Embedded `SessionStore`: session records, persistent subscriptions and the QoS 2 receiver
state of persistent sessions in SQLite, with the event log (sqlite_eventlog.py) in the same
file: every subscription change writes its log row in the transaction that changes the
subscriptions table, so the log holds exactly the durable changes."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from services.common.store.eventlog import EventKind, LogEvent, subscribed
from services.common.store.ports_session import (
    NEVER_EXPIRES,
    InboundQos2,
    Qos2Change,
    Qos2Update,
    SessionRecord,
    SubscriptionRecord,
)
from services.common.store.session_listing import prefix_end
from services.common.store.sqlite_eventlog import SCHEMA as LOG_SCHEMA
from services.common.store.sqlite_eventlog import SqliteEventLog, log_in_tx

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
  tenant TEXT NOT NULL, client_id TEXT NOT NULL, incarnation INTEGER NOT NULL,
  expiry_interval_s INTEGER NOT NULL, connected INTEGER NOT NULL,
  disconnected_at_ms INTEGER NOT NULL, expires_at_ms INTEGER, owner TEXT,
  qos2_fence INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant, client_id));
CREATE INDEX IF NOT EXISTS sessions_expiry ON sessions (expires_at_ms)
  WHERE expires_at_ms IS NOT NULL;
CREATE TABLE IF NOT EXISTS subscriptions (
  tenant TEXT NOT NULL, client_id TEXT NOT NULL, incarnation INTEGER NOT NULL,
  topic_filter TEXT NOT NULL, qos INTEGER NOT NULL, no_local INTEGER NOT NULL,
  retain_as_published INTEGER NOT NULL, retain_handling INTEGER NOT NULL,
  subscription_identifier INTEGER NOT NULL,
  PRIMARY KEY (tenant, client_id, incarnation, topic_filter));
CREATE TABLE IF NOT EXISTS inbound_qos2 (
  tenant TEXT NOT NULL, client_id TEXT NOT NULL, incarnation INTEGER NOT NULL,
  packet_id INTEGER NOT NULL, message_id TEXT NOT NULL, stored INTEGER NOT NULL,
  PRIMARY KEY (tenant, client_id, incarnation, packet_id));
"""

_SUB_COLS = (
    "tenant, client_id, incarnation, topic_filter, qos, no_local, retain_as_published, "
    "retain_handling, subscription_identifier"
)


def _sub(row: tuple[Any, ...]) -> SubscriptionRecord:
    t, c, i, f, q, nl, rap, rh, sid = row
    return SubscriptionRecord(
        str(t), str(c), int(i), str(f), int(q), bool(nl), bool(rap), int(rh), int(sid)
    )


_SESSION_COLS = (
    "tenant, client_id, incarnation, expiry_interval_s, connected, disconnected_at_ms, "
    "expires_at_ms, owner, qos2_fence"
)


class SqliteSessionStore(SqliteEventLog):
    def __init__(self, path: Path, sync: str = "full") -> None:
        super().__init__(path, _SCHEMA + LOG_SCHEMA, sync)
        # Files created before sessions had owners: add the column (NULL: owner unknown).
        cols = {row[1] for row in self.db.execute("PRAGMA table_info(sessions)")}
        if "owner" not in cols:
            self.db.execute("ALTER TABLE sessions ADD COLUMN owner TEXT")
        if "qos2_fence" not in cols:  # files from before QoS 2 fencing
            self.db.execute("ALTER TABLE sessions ADD COLUMN qos2_fence INTEGER NOT NULL DEFAULT 0")

    async def get_session(self, tenant: str, client_id: str) -> SessionRecord | None:
        # Every CONNECT reads its session: concurrent reads share a trip to the worker.
        row = await self.run_together(
            lambda: self.db.execute(
                "SELECT incarnation, expiry_interval_s, connected, disconnected_at_ms, owner, "
                "qos2_fence FROM sessions WHERE tenant=? AND client_id=?",
                (tenant, client_id),
            ).fetchone()
        )
        if row is None:
            return None
        return SessionRecord(
            tenant, client_id, row[0], row[1], bool(row[2]), row[3], row[4], row[5]
        )

    async def put_session(self, r: SessionRecord) -> None:
        expires = r.expires_at_ms()
        await self.run(
            lambda: self.db.execute(
                f"INSERT OR REPLACE INTO sessions ({_SESSION_COLS}) VALUES (?,?,?,?,?,?,?,?,?)",
                (
                    r.tenant,
                    r.client_id,
                    r.incarnation,
                    r.expiry_interval_s,
                    int(r.connected),
                    r.disconnected_at_ms,
                    expires,
                    r.owner,
                    r.qos2_fence,
                ),
            )
        )

    async def replace_session(self, r: SessionRecord, expect: SessionRecord | None) -> bool:
        values = (
            r.incarnation,
            r.expiry_interval_s,
            int(r.connected),
            r.disconnected_at_ms,
            r.expires_at_ms(),
            r.owner,
            r.qos2_fence,
        )

        def write() -> bool:
            if expect is None:
                cur = self.db.execute(
                    f"INSERT OR IGNORE INTO sessions ({_SESSION_COLS}) VALUES (?,?,?,?,?,?,?,?,?)",
                    (r.tenant, r.client_id, *values),
                )
            else:
                cur = self.db.execute(
                    "UPDATE sessions SET incarnation=?, expiry_interval_s=?, connected=?, "
                    "disconnected_at_ms=?, expires_at_ms=?, owner=?, qos2_fence=? "
                    "WHERE tenant=? AND client_id=? AND incarnation=? AND qos2_fence=? "
                    "AND connected=? AND expiry_interval_s=? AND disconnected_at_ms=?",
                    (
                        *values,
                        r.tenant,
                        r.client_id,
                        expect.incarnation,
                        expect.qos2_fence,
                        int(expect.connected),
                        expect.expiry_interval_s,
                        expect.disconnected_at_ms,
                    ),
                )
            return cur.rowcount == 1

        return await self.run(write)

    async def delete_session(self, tenant: str, client_id: str, incarnation: int) -> bool:
        cur = await self.run(
            lambda: self.db.execute(
                "DELETE FROM sessions WHERE tenant=? AND client_id=? AND incarnation=?",
                (tenant, client_id, incarnation),
            )
        )
        return cur.rowcount > 0

    async def offline_sessions(
        self, tenant: str, *, after: str, prefix: str, limit: int
    ) -> list[SessionRecord]:
        # The primary key (tenant, client_id) orders the scan; SQLite compares TEXT by bytes
        # (BINARY), the UTF-8 order the Cassandra store keeps too.
        sql = (
            "SELECT client_id, incarnation, expiry_interval_s, disconnected_at_ms, owner, "
            "qos2_fence FROM sessions WHERE tenant=? AND client_id>? AND client_id>=? "
            "AND connected=0 AND NOT (expiry_interval_s=0 AND disconnected_at_ms=0)"
        )
        args: list[object] = [tenant, after, prefix]
        end = prefix_end(prefix)
        if end is not None:
            sql += " AND client_id<?"
            args.append(end)
        sql += " ORDER BY client_id LIMIT ?"
        args.append(limit)
        rows = await self.run(lambda: self.db.execute(sql, args).fetchall())
        return [SessionRecord(tenant, c, i, e, False, d, o, f) for c, i, e, d, o, f in rows]

    async def expired_sessions(self, now_ms: int, limit: int = 1000) -> list[SessionRecord]:
        rows = await self.run(
            lambda: self.db.execute(
                "SELECT tenant, client_id, incarnation, expiry_interval_s, disconnected_at_ms, "
                "owner FROM sessions WHERE expires_at_ms IS NOT NULL AND expires_at_ms <= ? "
                "LIMIT ?",
                (now_ms, limit),
            ).fetchall()
        )
        return [SessionRecord(t, c, i, e, False, d, o) for t, c, i, e, d, o in rows]

    async def put_subscriptions(self, subs: list[SubscriptionRecord]) -> int:
        def write(db: sqlite3.Connection) -> int:
            db.executemany(
                f"INSERT OR REPLACE INTO subscriptions ({_SUB_COLS}) VALUES (?,?,?,?,?,?,?,?,?)",
                [
                    (
                        s.tenant,
                        s.client_id,
                        s.incarnation,
                        s.topic_filter,
                        s.qos,
                        int(s.no_local),
                        int(s.retain_as_published),
                        s.retain_handling,
                        s.subscription_identifier,
                    )
                    for s in subs
                ],
            )
            return log_in_tx(db, [subscribed(s) for s in subs])

        return await self.run(lambda: self.tx(write))

    async def delete_subscriptions(
        self, tenant: str, client_id: str, incarnation: int, filters: list[str]
    ) -> int:
        def write(db: sqlite3.Connection) -> int:
            db.executemany(
                "DELETE FROM subscriptions WHERE tenant=? AND client_id=? AND incarnation=? "
                "AND topic_filter=?",
                [(tenant, client_id, incarnation, f) for f in filters],
            )
            return log_in_tx(
                db,
                [
                    LogEvent(tenant, EventKind.UNSUBSCRIBED, client_id, incarnation, f)
                    for f in filters
                ],
            )

        return await self.run(lambda: self.tx(write))

    async def list_subscriptions(
        self, tenant: str, client_id: str, incarnation: int
    ) -> list[SubscriptionRecord]:
        rows = await self.run(
            lambda: self.db.execute(
                f"SELECT {_SUB_COLS} FROM subscriptions WHERE tenant=? AND client_id=? "
                "AND incarnation=? ORDER BY topic_filter",
                (tenant, client_id, incarnation),
            ).fetchall()
        )
        return [_sub(r) for r in rows]

    async def all_subscriptions(self) -> list[SubscriptionRecord]:
        rows = await self.run(
            lambda: self.db.execute(f"SELECT {_SUB_COLS} FROM subscriptions").fetchall()
        )
        return [_sub(r) for r in rows]

    async def drop_subscriptions(self, tenant: str, client_id: str, incarnation: int) -> int:
        def write(db: sqlite3.Connection) -> int:
            db.execute(
                "DELETE FROM subscriptions WHERE tenant=? AND client_id=? AND incarnation=?",
                (tenant, client_id, incarnation),
            )
            event = LogEvent(tenant, EventKind.SESSION_DROPPED, client_id, incarnation)
            return log_in_tx(db, [event])

        return await self.run(lambda: self.tx(write))

    async def subscriptions_as_of(self) -> tuple[int, list[SubscriptionRecord]]:
        """Every subscription and the log position they are as of (one read transaction:
        exactly the changes logged at or below that position)."""

        def read() -> tuple[int, list[SubscriptionRecord]]:
            self.db.execute("BEGIN")
            try:
                row = self.db.execute("SELECT position FROM log_head WHERE id = 0").fetchone()
                subs = self.db.execute(f"SELECT {_SUB_COLS} FROM subscriptions").fetchall()
            finally:
                self.db.execute("COMMIT")
            return (int(row[0]) if row else 0), [_sub(r) for r in subs]

        return await self.run(read)

    async def record_qos2(self, updates: list[Qos2Update]) -> None:
        def apply(db: sqlite3.Connection) -> None:
            # Each session's record read once per batch, in its transaction: a change is
            # taken or ignored against the fence as it stands when it is written.
            records: dict[tuple[str, str], tuple[int, int] | None] = {}
            for u in updates:
                if u.fence and u.change != Qos2Change.STORED:
                    key2 = (u.tenant, u.client_id)
                    if key2 not in records:
                        records[key2] = db.execute(
                            "SELECT incarnation, qos2_fence FROM sessions WHERE tenant=? AND "
                            "client_id=?",
                            key2,
                        ).fetchone()
                    rec = records[key2]
                    if rec is None or rec[0] != u.incarnation or u.fence < rec[1]:
                        continue  # the incarnation ended, or a later connection opened it
                key = (u.tenant, u.client_id, u.incarnation, u.packet_id)
                if u.change == Qos2Change.RECEIVED:
                    db.execute(
                        "INSERT OR REPLACE INTO inbound_qos2 VALUES (?,?,?,?,?,0)",
                        (*key, u.message_id),
                    )
                elif u.change == Qos2Change.STORED:
                    db.execute(
                        "UPDATE inbound_qos2 SET stored=1 WHERE tenant=? AND client_id=? AND "
                        "incarnation=? AND packet_id=? AND message_id=?",
                        (*key, u.message_id),
                    )
                else:
                    db.execute(
                        "DELETE FROM inbound_qos2 WHERE tenant=? AND client_id=? AND "
                        "incarnation=? AND packet_id=?",
                        key,
                    )

        # One transaction for the whole batch: one fsync however many sessions it carries.
        await self.run(lambda: self.tx(apply))

    async def list_qos2(self, tenant: str, client_id: str, incarnation: int) -> list[InboundQos2]:
        rows = await self.run(
            lambda: self.db.execute(
                "SELECT packet_id, message_id, stored FROM inbound_qos2 WHERE tenant=? AND "
                "client_id=? AND incarnation=? ORDER BY packet_id",
                (tenant, client_id, incarnation),
            ).fetchall()
        )
        return [InboundQos2(p, m, bool(s)) for p, m, s in rows]

    async def drop_qos2(self, tenant: str, client_id: str, incarnation: int) -> None:
        await self.run(
            lambda: self.db.execute(
                "DELETE FROM inbound_qos2 WHERE tenant=? AND client_id=? AND incarnation=?",
                (tenant, client_id, incarnation),
            )
        )


__all__ = ["NEVER_EXPIRES", "SqliteSessionStore"]
