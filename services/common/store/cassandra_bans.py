"""Cassandra `BanStore`: the ban list of the whole cluster, so every quota instance (on any
host) adds to, removes from and lists one list.

Tables (migration 2; docs/storage.md, "bans"):
- `ban_shards ((shard), kind, tenant, value)`: shard = crc32(kind/tenant/value) % SHARDS, so
  `max_bans` (100,000 by default) spreads over SHARDS partitions of ~6,000 rows (~2 MB)
  instead of one partition of 100,000. An expiring ban is written with a TTL, so Cassandra
  drops it when it ends; reads still filter by `expires_at_ms` (a TTL is whole seconds).
- `ban_version ((scope))`: a fresh id written after every change. Every holder lists every
  `ban_sync_s`; a store object reads this one row first and reads the shards again only when
  it changed (or FULL_READ_S passed: two writers' version rows resolve by their clocks, so a
  skewed clock could hide one change), so an unchanged list costs one single-row read, not
  SHARDS partition reads.
  The `max_bans` check counts that same cached list (re-read only after a change), not the
  table.

Only plain writes, never a lightweight transaction: a ban set after a removal must not come
out removed, and Cassandra orders a plain write and an LWT on one row by different clocks.
`remove` reads the row (LOCAL_QUORUM) to say whether it was there, then deletes it.
Two instances adding at the same moment may together pass the cap by what they add (the cap
bounds memory, it is no quota). Migration 1's single-partition `bans` table is no longer
read or written; an operator drops it after upgrading every quota instance.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
import zlib
from typing import Any

from services.common.bans import Ban, BanKind
from services.common.clock import now_ms
from services.common.store.cassandra import CassandraBase
from services.common.store.cassandra_schema import Migration

SHARDS = 16
FULL_READ_S = 60.0  # the longest a cached list is trusted without a change seen
_SCOPE = "all"
_COLUMNS = "kind, tenant, value, reason, expires_at_ms, created_at_ms, source"

MIGRATIONS = [
    Migration(
        1,
        "ban list",
        (
            """CREATE TABLE IF NOT EXISTS bans (
             scope text, kind int, tenant text, value text, reason text,
             expires_at_ms bigint, created_at_ms bigint, source text,
             PRIMARY KEY (scope, kind, tenant, value))""",
        ),
    ),
    Migration(
        2,
        "ban list in shards, with a version row",
        (
            """CREATE TABLE IF NOT EXISTS ban_shards (
             shard int, kind int, tenant text, value text, reason text,
             expires_at_ms bigint, created_at_ms bigint, source text,
             PRIMARY KEY ((shard), kind, tenant, value))""",
            """CREATE TABLE IF NOT EXISTS ban_version (
             scope text PRIMARY KEY, version text)""",
        ),
    ),
]


def shard_of(kind: int, tenant: str, value: str) -> int:
    return zlib.crc32(f"{kind}/{tenant}/{value}".encode()) % SHARDS


def ttl_s(expires_at_ms: int, now_ms: int) -> int:
    """The row's TTL: whole seconds until the ban ends, rounded up (never ends early);
    0 (no TTL in CQL) for a ban until removed."""
    if not expires_at_ms:
        return 0
    return max(1, math.ceil((expires_at_ms - now_ms) / 1000))


def _ban(r: Any) -> Ban:
    return Ban(
        kind=BanKind(r.kind),
        tenant=r.tenant,
        value=r.value,
        reason=r.reason or "",
        expires_at_ms=r.expires_at_ms or 0,
        created_at_ms=r.created_at_ms or 0,
        source=r.source or "operator",
    )


class CassandraBanStore(CassandraBase):
    component = "bans"
    migrations = MIGRATIONS

    def prepare(self) -> None:
        p = self._session.prepare
        self._put = p(
            f"INSERT INTO ban_shards (shard, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "USING TTL ?"
        )
        self._get = p(
            "SELECT kind FROM ban_shards WHERE shard=? AND kind=? AND tenant=? AND value=?"
        )
        self._shard = p(f"SELECT {_COLUMNS} FROM ban_shards WHERE shard=?")
        self._del = p("DELETE FROM ban_shards WHERE shard=? AND kind=? AND tenant=? AND value=?")
        self._version = p("SELECT version FROM ban_version WHERE scope=?")
        self._bump = p("INSERT INTO ban_version (scope, version) VALUES (?, ?)")
        # The list as of `_seen` (the version row read before the shards were).
        self._cached: list[Ban] = []
        self._seen: str | None = None
        self._read_at = 0.0  # time.monotonic() of the last full read

    async def _current(self) -> list[Ban]:
        """Every ban stored (expired ones included), re-read only after a change."""
        rows = await self._exec(self._version, (_SCOPE,))
        version = rows[0].version if rows else ""
        if version != self._seen or time.monotonic() - self._read_at > FULL_READ_S:
            self._read_at = time.monotonic()
            parts = await asyncio.gather(*(self._exec(self._shard, (s,)) for s in range(SHARDS)))
            self._cached = [_ban(r) for part in parts for r in part]
            self._seen = version
        return self._cached

    async def _changed(self) -> None:
        await self._exec(self._bump, (_SCOPE, uuid.uuid4().hex))

    async def put(self, ban: Ban, max_bans: int) -> bool:
        now = now_ms()
        shard = shard_of(*ban.key)
        if max_bans:
            exists = await self._exec(self._get, (shard, *ban.key))
            if not exists:
                in_force = sum(1 for b in await self._current() if b.active(now))
                if in_force >= max_bans:
                    return False
        await self._exec(
            self._put,
            (
                shard,
                int(ban.kind),
                ban.tenant,
                ban.value,
                ban.reason,
                ban.expires_at_ms,
                ban.created_at_ms,
                ban.source,
                ttl_s(ban.expires_at_ms, now),
            ),
        )
        await self._changed()
        return True

    async def remove(self, kind: BanKind, tenant: str, value: str) -> bool:
        key = (shard_of(int(kind), tenant, value), int(kind), tenant, value)
        existed = bool(await self._exec(self._get, key))
        if existed:
            await self._exec(self._del, key)
            await self._changed()
        return existed

    async def list(self) -> list[Ban]:
        now = now_ms()
        in_force = [b for b in await self._current() if b.active(now)]
        return sorted(in_force, key=lambda b: (b.created_at_ms, b.key))
