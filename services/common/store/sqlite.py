"""Embedded store: SQLite in WAL mode under the data directory, same logical schema as the
Cassandra keyspace. Calls run on one worker thread so the event loop never blocks on disk.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from services.common.acl import Access, AclRule
from services.common.store.ports_auth import UserRecord

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS users (
  tenant TEXT NOT NULL, username TEXT NOT NULL, password_hash TEXT NOT NULL,
  PRIMARY KEY (tenant, username));
CREATE TABLE IF NOT EXISTS acls (
  tenant TEXT NOT NULL, idx INTEGER NOT NULL, allow INTEGER NOT NULL, access INTEGER NOT NULL,
  topic_filter TEXT NOT NULL, username TEXT NOT NULL, client_id TEXT NOT NULL,
  PRIMARY KEY (tenant, idx));
"""


class SqliteStore:
    """`AuthStore` on SQLite. One connection, one thread: SQLite serializes writers anyway."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def get_user(self, tenant: str, username: str) -> UserRecord | None:
        def q() -> UserRecord | None:
            row = self._db.execute(
                "SELECT password_hash FROM users WHERE tenant=? AND username=?",
                (tenant, username),
            ).fetchone()
            return UserRecord(tenant, username, row[0]) if row else None

        return await self._run(q)

    async def put_user(self, user: UserRecord) -> None:
        await self._run(
            lambda: self._db.execute(
                "INSERT OR REPLACE INTO users VALUES (?, ?, ?)",
                (user.tenant, user.username, user.password_hash),
            )
        )

    async def delete_user(self, tenant: str, username: str) -> bool:
        cur = await self._run(
            lambda: self._db.execute(
                "DELETE FROM users WHERE tenant=? AND username=?", (tenant, username)
            )
        )
        return cur.rowcount > 0

    async def get_acl(self, tenant: str) -> list[AclRule]:
        rows = await self._run(
            lambda: self._db.execute(
                "SELECT allow, access, topic_filter, username, client_id FROM acls "
                "WHERE tenant=? ORDER BY idx",
                (tenant,),
            ).fetchall()
        )
        return [AclRule(bool(a), Access(ac), f, u, c) for a, ac, f, u, c in rows]

    async def set_acl(self, tenant: str, rules: list[AclRule]) -> None:
        def tx() -> None:
            with self._db:
                self._db.execute("BEGIN")
                self._db.execute("DELETE FROM acls WHERE tenant=?", (tenant,))
                self._db.executemany(
                    "INSERT INTO acls VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            tenant,
                            i,
                            int(r.allow),
                            int(r.access),
                            r.topic_filter,
                            r.username,
                            r.client_id,
                        )
                        for i, r in enumerate(rules)
                    ],
                )

        await self._run(tx)

    async def close(self) -> None:
        await self._run(self._db.close)
        self._pool.shutdown(wait=True)
