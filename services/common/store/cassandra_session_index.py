"""Each tenant's parked sessions on Cassandra, listable by client id without a scan of the
`sessions` table (whose partitions are single sessions).

Table (session migration 9; docs/storage.md, "Sessions"):
`sessions_by_tenant ((tenant, shard), client_id)`, shard = crc32 of the client id % SHARDS,
so one tenant's 10 M sessions are 32 partitions of ~310,000 small rows (~15 MB). A row is put
(plain write) whenever a record is written parked, and deleted when its session's record is
deleted; a record that was resumed keeps its row. So the index holds a superset of the parked
sessions (plus, rarely, a session whose delete raced its index write): `page` reads each
candidate's record and keeps the parked ones. Every read is bounded to one partition, a
client-id range and a LIMIT.
"""

from __future__ import annotations

import asyncio
import heapq
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from services.common.store.cassandra_schema import Migration
from services.common.store.ports_session import SessionRecord
from services.common.store.session_listing import is_offline, prefix_end

SHARDS = 32
# Rounds of reading candidates for one page: each skips the candidates found resumed or gone.
_MAX_ROUNDS = 4
_TOP = "\U0010ffff"  # above every client id that does not start with U+10FFFF

MIGRATION = Migration(
    9,
    "each tenant's parked sessions by client id",
    (
        """CREATE TABLE IF NOT EXISTS sessions_by_tenant (
         tenant text, shard int, client_id text,
         PRIMARY KEY ((tenant, shard), client_id))""",
    ),
)

Run = Callable[[Any, tuple[Any, ...]], Awaitable[list[Any]]]
Get = Callable[[str, str], Awaitable[SessionRecord | None]]


def shard_of(client_id: str) -> int:
    return zlib.crc32(client_id.encode()) % SHARDS


class TenantIndex:
    """The index's statements; `run` executes a prepared statement, every page."""

    def __init__(self, *, prepare: Callable[[str], Any], run: Run) -> None:
        self._run = run
        table = "sessions_by_tenant"
        self._put = prepare(f"INSERT INTO {table} (tenant, shard, client_id) VALUES (?,?,?)")
        self._del = prepare(f"DELETE FROM {table} WHERE tenant=? AND shard=? AND client_id=?")
        # Above a cursor (`>`) or from a prefix on (`>=`), below the prefix's end.
        select = f"SELECT client_id FROM {table} WHERE tenant=? AND shard=? AND client_id"
        self._above = prepare(f"{select}>? AND client_id<? LIMIT ?")
        self._from = prepare(f"{select}>=? AND client_id<? LIMIT ?")

    async def written(self, r: SessionRecord) -> None:
        """`r` was written: index it if it is parked."""
        if is_offline(r):
            await self._run(self._put, (r.tenant, shard_of(r.client_id), r.client_id))

    async def deleted(self, tenant: str, client_id: str) -> None:
        await self._run(self._del, (tenant, shard_of(client_id), client_id))

    async def page(
        self, tenant: str, *, after: str, prefix: str, limit: int, get: Get
    ) -> list[SessionRecord]:
        """Up to `limit` parked sessions above `after` starting with `prefix`, by client id."""
        ceiling = prefix_end(prefix) or _TOP
        stmt, floor = (self._above, after) if after >= prefix else (self._from, prefix)
        out: list[SessionRecord] = []
        for _ in range(_MAX_ROUNDS):
            wanted = limit - len(out)
            ids = await self._candidates(stmt, (tenant, floor, ceiling, wanted))
            for client_id in ids:
                rec = await get(tenant, client_id)
                if rec is not None and is_offline(rec):
                    out.append(rec)
            if len(out) >= limit or len(ids) < wanted:
                break
            stmt, floor = self._above, ids[-1]
        return out

    async def _candidates(self, stmt: Any, args: tuple[str, str, str, int]) -> list[str]:
        """The first `limit` indexed client ids in range over every shard, merged."""
        tenant, floor, ceiling, limit = args
        pages = await asyncio.gather(
            *(self._run(stmt, (tenant, shard, floor, ceiling, limit)) for shard in range(SHARDS))
        )
        merged = heapq.merge(*(sorted(r.client_id for r in rows) for rows in pages))
        return [c for _, c in zip(range(limit), merged, strict=False)]
