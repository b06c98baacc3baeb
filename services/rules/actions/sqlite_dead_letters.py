"""The dead-letter store in a SQLite file under the rules service's data directory (the
default backend): letters and per-rule totals, each write bounded by the rule's limits."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from services.common.store.sqlite_base import SqliteDb
from services.rules.actions.dead_letter_codec import EncodedBatch, decode_output
from services.rules.actions.dead_letter_store import (
    DeadLetter,
    DeadLetterLimits,
    DeadLetterStats,
    DeadLetterStore,
    oldest_to_drop,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS dead_letters (
  id INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, rule_id TEXT NOT NULL,
  action TEXT NOT NULL, output TEXT NOT NULL, error TEXT NOT NULL, attempts INTEGER NOT NULL,
  failed_at_ms INTEGER NOT NULL, size INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS dead_letters_rule ON dead_letters (tenant, rule_id, id);
CREATE TABLE IF NOT EXISTS dead_letter_totals (
  tenant TEXT NOT NULL, rule_id TEXT NOT NULL, count INTEGER NOT NULL, bytes INTEGER NOT NULL,
  PRIMARY KEY (tenant, rule_id));
"""

_COLUMNS = "id, tenant, rule_id, action, output, error, attempts, failed_at_ms, size"


def _row(r: Sequence[Any]) -> DeadLetter:
    return DeadLetter(r[0], r[1], r[2], r[3], decode_output(r[4]), r[5], r[6], r[7], r[8])


class SqliteDeadLetters(DeadLetterStore):
    """Dead letters in a SQLite file (WAL, synchronous=FULL: written means kept). Per-rule
    totals live in their own table so a write checks the bounds without a scan."""

    def __init__(self, path: Path, limits: DeadLetterLimits | None = None) -> None:
        super().__init__(limits or DeadLetterLimits())
        self._db = SqliteDb(path, _SCHEMA)

    async def _write_batch(self, batch: EncodedBatch) -> int:
        return await self._db.run(lambda: self._db.tx(lambda db: self._write(db, batch)))

    def _write(self, db: Any, b: EncodedBatch) -> int:
        """Insert the batch, then evict the rule's oldest letters past its limits (in one
        transaction); how many were evicted."""
        db.executemany(
            "INSERT INTO dead_letters (tenant, rule_id, action, output, error, attempts,"
            " failed_at_ms, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (b.tenant, b.rule_id, b.action, t, b.error, b.attempts, b.failed_at_ms, s)
                for t, s in b.letters
            ],
        )
        db.execute(
            "INSERT INTO dead_letter_totals VALUES (?, ?, ?, ?) ON CONFLICT (tenant, rule_id)"
            " DO UPDATE SET count = count + excluded.count, bytes = bytes + excluded.bytes",
            (b.tenant, b.rule_id, len(b.letters), sum(s for _, s in b.letters)),
        )
        count, size = db.execute(
            "SELECT count, bytes FROM dead_letter_totals WHERE tenant=? AND rule_id=?",
            (b.tenant, b.rule_id),
        ).fetchone()
        if count <= self.limits.max_count and size <= self.limits.max_bytes:
            return 0
        rows = db.execute(
            "SELECT id, size FROM dead_letters WHERE tenant=? AND rule_id=? ORDER BY id",
            (b.tenant, b.rule_id),
        )
        gone, freed = oldest_to_drop(rows, count, size, self.limits)
        db.executemany("DELETE FROM dead_letters WHERE id=?", [(i,) for i in gone])
        db.execute(
            "UPDATE dead_letter_totals SET count = count - ?, bytes = bytes - ?"
            " WHERE tenant=? AND rule_id=?",
            (len(gone), freed, b.tenant, b.rule_id),
        )
        return len(gone)

    async def list(
        self, tenant: str, rule_id: str, *, after_id: int = 0, limit: int = 100
    ) -> builtins.list[DeadLetter]:
        rows = await self._db.run(
            lambda: self._db.db.execute(
                f"SELECT {_COLUMNS} FROM dead_letters WHERE tenant=? AND rule_id=? AND id>?"
                " ORDER BY id LIMIT ?",
                (tenant, rule_id, after_id, limit),
            ).fetchall()
        )
        return [_row(r) for r in rows]

    async def get(self, tenant: str, rule_id: str, ids: Iterable[int]) -> builtins.list[DeadLetter]:
        wanted = sorted(set(ids))
        if not wanted:
            return []
        marks = ",".join("?" * len(wanted))
        rows = await self._db.run(
            lambda: self._db.db.execute(
                f"SELECT {_COLUMNS} FROM dead_letters WHERE tenant=? AND rule_id=?"
                f" AND id IN ({marks}) ORDER BY id",
                (tenant, rule_id, *wanted),
            ).fetchall()
        )
        return [_row(r) for r in rows]

    async def delete(self, tenant: str, rule_id: str, ids: Iterable[int]) -> int:
        wanted = sorted(set(ids))
        if not wanted:
            return 0
        marks = ",".join("?" * len(wanted))

        def remove(db: Any) -> int:
            n, size = db.execute(
                f"SELECT COUNT(*), COALESCE(SUM(size), 0) FROM dead_letters WHERE tenant=?"
                f" AND rule_id=? AND id IN ({marks})",
                (tenant, rule_id, *wanted),
            ).fetchone()
            db.execute(
                f"DELETE FROM dead_letters WHERE tenant=? AND rule_id=? AND id IN ({marks})",
                (tenant, rule_id, *wanted),
            )
            db.execute(
                "UPDATE dead_letter_totals SET count = count - ?, bytes = bytes - ?"
                " WHERE tenant=? AND rule_id=?",
                (n, size, tenant, rule_id),
            )
            return int(n)

        return await self._db.run(lambda: self._db.tx(remove))

    async def purge(self, tenant: str, rule_id: str) -> int:
        def remove(db: Any) -> int:
            n = db.execute(
                "DELETE FROM dead_letters WHERE tenant=? AND rule_id=?", (tenant, rule_id)
            ).rowcount
            db.execute(
                "DELETE FROM dead_letter_totals WHERE tenant=? AND rule_id=?", (tenant, rule_id)
            )
            return int(n)

        return await self._db.run(lambda: self._db.tx(remove))

    async def stats(self, tenant: str, rule_id: str) -> DeadLetterStats:
        row = await self._db.run(
            lambda: self._db.db.execute(
                "SELECT count, bytes FROM dead_letter_totals WHERE tenant=? AND rule_id=?",
                (tenant, rule_id),
            ).fetchone()
        )
        return DeadLetterStats(int(row[0]), int(row[1])) if row else DeadLetterStats(0, 0)

    async def close(self) -> None:
        await self._db.close()
