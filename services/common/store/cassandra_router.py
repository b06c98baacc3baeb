"""Cassandra `RouterStore`: retained ((tenant, bucket), topic) with bucket = crc32(topic) % 16
so a tenant's retained messages spread over several partitions; delayed ((due_bucket), due_ms,
tenant, id) with due_bucket = due_ms // 60000, so the scheduler finds due messages per minute.

Retained rows take only plain writes, never a lightweight transaction: a clear (delete)
followed by a set must never come out reversed, and Cassandra orders a plain write and an LWT
on one row by different clocks. `delete_retained` reads the row (LOCAL_QUORUM) to say whether
it was there, then deletes it; queue compaction removes an expired one with a delete at the
row's own write time (`USING TIMESTAMP`), which cannot shadow a newer set.
"""

from __future__ import annotations

import zlib

from services.common.store.cassandra import CassandraBase
from services.common.store.cassandra_schema import Migration
from services.common.store.ports_router import DelayedRecord, RetainedRecord

RETAINED_BUCKETS = 16


def _bucket(topic: str) -> int:
    return zlib.crc32(topic.encode()) % RETAINED_BUCKETS


MIGRATIONS = [
    Migration(
        1,
        "retained and delayed messages",
        (
            """CREATE TABLE IF NOT EXISTS retained (
             tenant text, bucket int, topic text, data blob, expires_at_ms bigint,
             PRIMARY KEY ((tenant, bucket), topic))""",
            """CREATE TABLE IF NOT EXISTS retained_tenants (tenant text PRIMARY KEY)""",
            """CREATE TABLE IF NOT EXISTS delayed (
             due_bucket bigint, due_ms bigint, tenant text, id text, data blob,
             PRIMARY KEY ((due_bucket), due_ms, tenant, id))""",
            """CREATE TABLE IF NOT EXISTS delayed_by_id (
             tenant text, id text, due_ms bigint, PRIMARY KEY ((tenant), id))""",
        ),
    )
]


class CassandraRouterStore(CassandraBase):
    component = "router"
    migrations = MIGRATIONS

    def prepare(self) -> None:
        p = self._session.prepare
        self._r_put = p(
            "INSERT INTO retained (tenant, bucket, topic, data, expires_at_ms) VALUES (?,?,?,?,?)"
        )
        self._r_tenant = p("INSERT INTO retained_tenants (tenant) VALUES (?)")
        self._r_del = p("DELETE FROM retained WHERE tenant=? AND bucket=? AND topic=?")
        self._r_get = p(
            "SELECT expires_at_ms FROM retained WHERE tenant=? AND bucket=? AND topic=?"
        )
        self._r_tenants = p("SELECT tenant FROM retained_tenants")
        self._r_scan = p(
            "SELECT topic, data, expires_at_ms FROM retained WHERE tenant=? AND bucket=?"
        )
        self._d_put = p(
            "INSERT INTO delayed (due_bucket, due_ms, tenant, id, data) VALUES (?,?,?,?,?)"
        )
        self._d_idx = p("INSERT INTO delayed_by_id (tenant, id, due_ms) VALUES (?,?,?)")
        self._d_get = p("SELECT due_ms FROM delayed_by_id WHERE tenant=? AND id=?")
        self._d_del = p("DELETE FROM delayed WHERE due_bucket=? AND due_ms=? AND tenant=? AND id=?")
        self._d_idx_del = p("DELETE FROM delayed_by_id WHERE tenant=? AND id=?")
        self._d_ids = p("SELECT tenant, id, due_ms FROM delayed_by_id")
        self._d_one = p(
            "SELECT data FROM delayed WHERE due_bucket=? AND due_ms=? AND tenant=? AND id=?"
        )

    async def put_retained(self, r: RetainedRecord) -> None:
        await self._exec(
            self._r_put, (r.tenant, _bucket(r.topic), r.topic, r.data, r.expires_at_ms)
        )
        await self._exec(self._r_tenant, (r.tenant,))

    async def delete_retained(self, tenant: str, topic: str) -> bool:
        key = (tenant, _bucket(topic), topic)
        if not await self._exec(self._r_get, key):
            return False
        await self._exec(self._r_del, key)
        return True

    async def all_retained(self) -> list[RetainedRecord]:
        out = []
        for t in await self._exec(self._r_tenants):
            for b in range(RETAINED_BUCKETS):
                for r in await self._exec(self._r_scan, (t.tenant, b)):
                    out.append(RetainedRecord(t.tenant, r.topic, r.data, r.expires_at_ms))
        return out

    async def tenant_retained(self, tenant: str) -> list[RetainedRecord]:
        return [
            RetainedRecord(tenant, r.topic, r.data, r.expires_at_ms)
            for b in range(RETAINED_BUCKETS)
            for r in await self._exec(self._r_scan, (tenant, b))
        ]

    async def put_delayed(self, r: DelayedRecord) -> None:
        await self._exec(self._d_put, (r.due_ms // 60000, r.due_ms, r.tenant, r.id, r.data))
        await self._exec(self._d_idx, (r.tenant, r.id, r.due_ms))

    async def delete_delayed(self, tenant: str, id: str) -> bool:
        rows = list(await self._exec(self._d_get, (tenant, id)))
        if not rows:
            return False
        due = rows[0].due_ms
        await self._exec(self._d_del, (due // 60000, due, tenant, id))
        await self._exec(self._d_idx_del, (tenant, id))
        return True

    async def all_delayed(self) -> list[DelayedRecord]:
        out = []
        for row in await self._exec(self._d_ids):
            data = list(
                await self._exec(self._d_one, (row.due_ms // 60000, row.due_ms, row.tenant, row.id))
            )
            if data:
                out.append(DelayedRecord(row.id, row.tenant, row.due_ms, data[0].data))
        return sorted(out, key=lambda r: r.due_ms)
