"""Cassandra `BanStore`: the ban list of the whole cluster, so every quota instance (on any
host) adds to, removes from and lists one list.

All bans are rows of one partition (`scope` 'all'): `max_bans` (100,000 by default) rows of
a few hundred bytes stay far below Cassandra's partition size limits, and listing the whole
list, which every holder does every `ban_sync_s`, is one partition read instead of a table
scan. An expiring ban is written with a TTL, so Cassandra drops it when it ends; reads still
filter by `expires_at_ms` (a TTL is whole seconds).

The `max_bans` check counts the partition before the write: two instances adding at the same
moment may together pass the cap by what they add (the cap bounds memory, it is no quota).
"""

from __future__ import annotations

import math
import time

from services.common.bans import Ban, BanKind
from services.common.store.cassandra import CassandraBase
from services.common.store.cassandra_schema import Migration

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
    )
]


def _now_ms() -> int:
    return int(time.time() * 1000)


def ttl_s(expires_at_ms: int, now_ms: int) -> int:
    """The row's TTL: whole seconds until the ban ends, rounded up (never ends early);
    0 (no TTL in CQL) for a ban until removed."""
    if not expires_at_ms:
        return 0
    return max(1, math.ceil((expires_at_ms - now_ms) / 1000))


class CassandraBanStore(CassandraBase):
    component = "bans"
    migrations = MIGRATIONS

    def prepare(self) -> None:
        p = self._session.prepare
        self._put = p(
            f"INSERT INTO bans (scope, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?"
        )
        self._get = p("SELECT kind FROM bans WHERE scope=? AND kind=? AND tenant=? AND value=?")
        self._count = p("SELECT COUNT(*) FROM bans WHERE scope=?")
        self._all = p(f"SELECT {_COLUMNS} FROM bans WHERE scope=?")
        self._del = p(
            "DELETE FROM bans WHERE scope=? AND kind=? AND tenant=? AND value=? IF EXISTS"
        )

    async def put(self, ban: Ban, max_bans: int) -> bool:
        now = _now_ms()
        if max_bans:
            exists = await self._exec(self._get, (_SCOPE, *ban.key))
            if not exists:
                [(count,)] = await self._exec(self._count, (_SCOPE,))
                if count >= max_bans:
                    return False
        await self._exec(
            self._put,
            (
                _SCOPE,
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
        return True

    async def remove(self, kind: BanKind, tenant: str, value: str) -> bool:
        rows = await self._exec(self._del, (_SCOPE, int(kind), tenant, value))
        return bool(rows and rows[0][0])

    async def list(self) -> list[Ban]:
        now = _now_ms()
        bans = [
            Ban(
                kind=BanKind(r.kind),
                tenant=r.tenant,
                value=r.value,
                reason=r.reason or "",
                expires_at_ms=r.expires_at_ms or 0,
                created_at_ms=r.created_at_ms or 0,
                source=r.source or "operator",
            )
            for r in await self._exec(self._all, (_SCOPE,))
        ]
        in_force = [b for b in bans if b.active(now)]
        return sorted(in_force, key=lambda b: (b.created_at_ms, b.key))
