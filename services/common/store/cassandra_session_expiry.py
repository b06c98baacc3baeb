"""The session expiry index on Cassandra: which sessions' expiry has passed, found without a
full scan and without reading through the tombstones of earlier sweeps.

Tables (session migration 8; docs/storage.md, "Sessions"):
- `session_expiry_buckets ((shard, bucket), due_ms, tenant, client_id)`: due_ms =
  max(expires_at_ms, the writer's clock), bucket = due_ms // BUCKET_MS, shard = crc32 of the
  client % SHARDS. A partition holds one shard's expiries of one minute, in due order; a
  record written already expired (a clean start's ended record, expiry 0) is due at the
  writer's clock, so it never lands behind the sweep. The session row keeps its due_ms
  (`expiry_due_ms`), so its index row is deleted where it was put.
- `session_expiry_cursor ((shard))`: the first bucket the sweep has not passed. Written only
  `USING TIMESTAMP <bucket>`, so the highest bucket wins whatever order two sweepers'
  writes land in (last write wins by timestamp) and it never moves back.

Theory of operation: a sweep reads, per shard, the buckets from the cursor to now. A bucket
wholly older than GRACE_MS whose rows are all gone (their sessions discarded, or found stale
and deleted) is passed: the cursor moves beyond it and no sweep reads it, or its tombstones,
again. A bucket still holding an expired session (its discard failed, or is under way) holds
the cursor, so the next sweep returns the session again. Within an open bucket the sweep
starts where its previous read found the first row still there (less GRACE_MS, for writers
whose clock runs behind), so a minute in which many sessions expire is not re-read through
the tombstones of those already discarded. GRACE_MS covers such writers everywhere. Rows of
migration 1's unbucketed `session_expiry` table are swept (and deleted) until it is empty in
this process, then no longer read.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.common.clock import now_ms
from services.common.store.cassandra_schema import AddColumn, Migration

SHARDS = 64
BUCKET_MS = 60_000
GRACE_MS = 60_000  # a bucket is passed only this long after it ended
FIRST_LOOKBACK_BUCKETS = 60  # with no cursor yet (a new keyspace): start an hour back
_MAX_RESUMES = 10_000  # (shard, bucket) read positions remembered

log = logging.getLogger("starling.store.cassandra")

MIGRATION = Migration(
    8,
    "session expiry in minute buckets, with a sweep cursor",
    (
        """CREATE TABLE IF NOT EXISTS session_expiry_buckets (
         shard int, bucket bigint, due_ms bigint, tenant text, client_id text,
         PRIMARY KEY ((shard, bucket), due_ms, tenant, client_id))""",
        """CREATE TABLE IF NOT EXISTS session_expiry_cursor (
         shard int PRIMARY KEY, bucket bigint)""",
        AddColumn("sessions", "expiry_due_ms", "bigint"),
    ),
)

Run = Callable[[Any, tuple[Any, ...]], Awaitable[list[Any]]]
NOT_YET = object()  # what a check answers for a row whose session is not expired yet


def shard_of(tenant: str, client_id: str) -> int:
    return zlib.crc32(f"{tenant}/{client_id}".encode()) % SHARDS


def _wall_ms() -> int:
    return now_ms()


@dataclass(frozen=True, slots=True)
class Due:
    """An index row found due: the session to look at, and where its row is."""

    tenant: str
    client_id: str
    shard: int
    due_ms: int
    legacy: bool = False  # a row of migration 1's `session_expiry` (due_ms: the expiry)


# A row -> the session record when it is expired, NOT_YET, or None when the row is stale
# (the session is gone, or its record is indexed elsewhere now).
Check = Callable[[Due], Awaitable[Any]]


class ExpiryIndex:
    """The index's statements and the sweep (owns the read positions and which legacy
    shards are empty in this process). `run` executes a prepared statement, every page."""

    def __init__(self, *, prepare: Callable[[str], Any], run: Run) -> None:
        self._run = run
        table = "session_expiry_buckets"
        self._put = prepare(
            f"INSERT INTO {table} (shard, bucket, due_ms, tenant, client_id) VALUES (?,?,?,?,?)"
        )
        self._del = prepare(
            f"DELETE FROM {table} WHERE shard=? AND bucket=? AND due_ms=? AND tenant=? AND "
            "client_id=?"
        )
        self._scan = prepare(
            f"SELECT due_ms, tenant, client_id FROM {table} WHERE shard=? AND bucket=? "
            "AND due_ms>=? AND due_ms<=? LIMIT ?"
        )
        self._cursor_get = prepare("SELECT bucket FROM session_expiry_cursor WHERE shard=?")
        self._cursor_put = prepare(
            "INSERT INTO session_expiry_cursor (shard, bucket) VALUES (?,?) USING TIMESTAMP ?"
        )
        self._legacy_scan = prepare(
            "SELECT expires_at_ms, tenant, client_id FROM session_expiry "
            "WHERE shard=? AND expires_at_ms<=? LIMIT ?"
        )
        self._legacy_any = prepare("SELECT tenant FROM session_expiry WHERE shard=? LIMIT 1")
        self._legacy_del = prepare(
            "DELETE FROM session_expiry WHERE shard=? AND expires_at_ms=? AND "
            "tenant=? AND client_id=?"
        )
        self._legacy_shards = 16  # migration 1 sharded by crc32 % 16
        self._legacy_empty: set[int] = set()
        self._resume: dict[tuple[int, int], int] = {}  # (shard, bucket) -> first row seen

    def due_at(self, expires_at_ms: int | None) -> int | None:
        """When a record with this expiry is indexed as due (None: never expires)."""
        return None if expires_at_ms is None else max(expires_at_ms, _wall_ms())

    def _key(self, tenant: str, client_id: str, due_ms: int) -> tuple[Any, ...]:
        return (shard_of(tenant, client_id), due_ms // BUCKET_MS, due_ms, tenant, client_id)

    async def add(self, tenant: str, client_id: str, due_ms: int) -> None:
        await self._run(self._put, self._key(tenant, client_id, due_ms))

    async def remove(self, tenant: str, client_id: str, due_ms: int) -> None:
        await self._run(self._del, self._key(tenant, client_id, due_ms))

    async def drop(self, row: Due) -> None:
        """Delete an index row the sweep found stale (its session changed or is gone)."""
        if row.legacy:
            await self._run(self._legacy_del, (row.shard, row.due_ms, row.tenant, row.client_id))
        else:
            await self.remove(row.tenant, row.client_id, row.due_ms)

    async def due(self, now_ms: int, limit: int, check: Check) -> list[Any]:
        """What `check` makes of the index rows due by now_ms (a row it answers None for is
        stale and deleted), each session once, at most `limit`; the cursors advance over
        drained buckets. A shard whose reads fail is left for the next sweep."""
        parts = await asyncio.gather(
            *(self._shard(s, now_ms, limit, check) for s in range(SHARDS)),
            return_exceptions=True,
        )
        failed = [p for p in parts if isinstance(p, BaseException)]
        if len(failed) == len(parts):
            raise failed[0]
        for exc in failed:
            log.warning("session_expiry_shard_failed error=%s", exc)
        seen: dict[tuple[str, str], Any] = {}  # a session indexed twice (a stale row) once
        for part in parts:
            if not isinstance(part, BaseException):
                for found in part:
                    seen.setdefault((found.tenant, found.client_id), found)
        return list(seen.values())[:limit]

    async def _shard(self, shard: int, now_ms: int, limit: int, check: Check) -> list[Any]:
        out: list[Any] = []
        if shard < self._legacy_shards and shard not in self._legacy_empty:
            out += await self._legacy(shard, now_ms, limit, check)
        wall = _wall_ms()
        rows = await self._run(self._cursor_get, (shard,))
        start = rows[0].bucket if rows else wall // BUCKET_MS - FIRST_LOOKBACK_BUCKETS
        upto = max(now_ms, wall)  # rows due by the wall clock: the check judges them by now_ms
        closed = (min(now_ms, wall) - GRACE_MS) // BUCKET_MS  # buckets before it are closed
        cursor = start
        for bucket in range(start, upto // BUCKET_MS + 1):
            if len(out) >= limit:
                break
            found, held = await self._bucket(shard, bucket, upto, limit - len(out), check)
            out += found
            if not held and cursor == bucket and bucket < closed:
                cursor = bucket + 1  # drained and closed: no sweep reads it again
                self._resume.pop((shard, bucket), None)
        if cursor > start:
            await self._run(self._cursor_put, (shard, cursor, cursor))
        return out

    async def _bucket(
        self, shard: int, bucket: int, upto: int, limit: int, check: Check
    ) -> tuple[list[Any], bool]:
        """The expired sessions of the bucket's rows due by `upto`, and whether any row
        stays (expired or not yet: the bucket is not drained)."""
        key = (shard, bucket)
        since = self._resume.get(key, bucket * BUCKET_MS)
        rows = await self._run(self._scan, (shard, bucket, since, upto, limit))
        if rows:  # everything before the first row left is gone: start there next time
            if len(self._resume) >= _MAX_RESUMES:
                self._resume.clear()
            self._resume[key] = max(bucket * BUCKET_MS, rows[0].due_ms - GRACE_MS)
        due = [Due(r.tenant, r.client_id, shard, r.due_ms) for r in rows]
        return await self._checked(due, check)

    async def _checked(self, rows: list[Due], check: Check) -> tuple[list[Any], bool]:
        out, held = [], False
        for row in rows:
            found = await check(row)
            if found is None:
                await self.drop(row)
                continue
            held = True
            if found is not NOT_YET:
                out.append(found)
        return out, held

    async def _legacy(self, shard: int, now_ms: int, limit: int, check: Check) -> list[Any]:
        rows = await self._run(self._legacy_scan, (shard, now_ms, limit))
        if not rows and not await self._run(self._legacy_any, (shard,)):
            self._legacy_empty.add(shard)  # nothing left, due or not: never read again
        due = [Due(r.tenant, r.client_id, shard, r.expires_at_ms, legacy=True) for r in rows]
        return (await self._checked(due, check))[0]
