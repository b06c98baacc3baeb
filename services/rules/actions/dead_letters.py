"""The per-rule dead-letter store: outputs an action could not deliver after its retries, kept
durably so an operator can list, replay or purge them.

Two backends with one contract: `SqliteDeadLetters` (a file under the rules service's data
directory, the default) and `CassandraDeadLetters` (for a mesh on Cassandra). Each rule's
letters are bounded by count and bytes (`DeadLetterLimits`): past either bound the oldest are
dropped and the drop is counted, so a target that stays down cannot fill the disk.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import json
import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.common.store.sqlite_base import SqliteDb
from services.rules.actions.base import Output

log = logging.getLogger("starling.rules.dead_letters")

# How many letters one replay hands to an action at a time (one request for batching targets).
REPLAY_CHUNK = 100

SendFn = Callable[[str, Sequence[Output]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class DeadLetterLimits:
    """Bounds of one rule's dead letters; the oldest go first past either."""

    max_count: int = 10_000
    max_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: int
    tenant: str
    rule_id: str
    action: str  # the name of the rule's action that failed
    output: Output
    error: str  # the last attempt's error
    attempts: int
    failed_at_ms: int
    size: int  # bytes this letter counts against `max_bytes`


@dataclass(frozen=True, slots=True)
class DeadLetterStats:
    count: int
    bytes: int


@dataclass(slots=True)
class ReplayResult:
    delivered: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)  # one line per failed group, bounded


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return {"$b64": base64.b64encode(bytes(value)).decode()}
    return str(value)  # a column of a type JSON lacks keeps its text rather than failing


def _json_hook(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and "$b64" in obj:
        return base64.b64decode(obj["$b64"])
    return obj


def encode_output(o: Output) -> str:
    """The stored form of an output (JSON; bytes as base64)."""
    return json.dumps(
        {
            "tenant": o.tenant,
            "rule_id": o.rule_id,
            "topic": o.topic,
            "columns": o.columns,
            "payload": base64.b64encode(o.payload).decode(),
            "qos": o.qos,
            "message_id": o.message_id,
            "published_at_ms": o.published_at_ms,
            "user_properties": [list(p) for p in o.user_properties],
            "clientid": o.clientid,
        },
        default=_json_default,
        separators=(",", ":"),
    )


def decode_output(text: str) -> Output:
    d = json.loads(text, object_hook=_json_hook)
    return Output(
        tenant=d["tenant"],
        rule_id=d["rule_id"],
        topic=d["topic"],
        columns=d["columns"],
        payload=base64.b64decode(d["payload"]),
        qos=d["qos"],
        message_id=d["message_id"],
        published_at_ms=d["published_at_ms"],
        user_properties=tuple((k, v) for k, v in d["user_properties"]),
        clientid=d.get("clientid", ""),
    )


class DeadLetterStore(ABC):
    """The contract both backends keep (tests/rules/actions/test_dead_letters.py)."""

    def __init__(self, limits: DeadLetterLimits) -> None:
        self.limits = limits

    @abstractmethod
    async def add(
        self,
        tenant: str,
        rule_id: str,
        action: str,
        outputs: Sequence[Output],
        error: str,
        attempts: int,
    ) -> int:
        """Keep `outputs` durably (returns once written); the number of letters dropped to
        stay within the limits (older ones, or a single letter larger than `max_bytes`)."""

    @abstractmethod
    async def list(
        self, tenant: str, rule_id: str, *, after_id: int = 0, limit: int = 100
    ) -> builtins.list[DeadLetter]:
        """Oldest first, ids greater than `after_id` (pages: pass the last id seen)."""

    @abstractmethod
    async def get(
        self, tenant: str, rule_id: str, ids: Iterable[int]
    ) -> builtins.list[DeadLetter]: ...

    @abstractmethod
    async def delete(self, tenant: str, rule_id: str, ids: Iterable[int]) -> int: ...

    @abstractmethod
    async def purge(self, tenant: str, rule_id: str) -> int:
        """Drop every letter of the rule (also when the rule is deleted); how many."""

    @abstractmethod
    async def stats(self, tenant: str, rule_id: str) -> DeadLetterStats: ...

    @abstractmethod
    async def close(self) -> None: ...

    async def replay(
        self, tenant: str, rule_id: str, ids: Sequence[int], send: SendFn
    ) -> ReplayResult:
        """Hand the letters `ids` (all of the rule's when empty) back to their actions through
        `send(action, outputs)`, oldest first and grouped per action; a letter is removed only
        once `send` returned for it. A failed group stays stored and that action is not tried
        again in this replay (its target is still down)."""
        result = ReplayResult()
        broken: set[str] = set()
        async for letters in self._pages(tenant, rule_id, ids):
            by_action: dict[str, list[DeadLetter]] = {}
            for letter in letters:
                by_action.setdefault(letter.action, []).append(letter)
            for action, group in by_action.items():
                if action in broken:
                    result.failed += len(group)
                    continue
                try:
                    await send(action, [g.output for g in group])
                except Exception as exc:
                    broken.add(action)
                    result.failed += len(group)
                    if len(result.errors) < 10:
                        result.errors.append(f"{action}: {exc!r}"[:500])
                    continue
                await self.delete(tenant, rule_id, [g.id for g in group])
                result.delivered += len(group)
        return result

    async def _pages(self, tenant: str, rule_id: str, ids: Sequence[int]) -> Any:
        if ids:
            wanted = sorted(set(ids))
            for i in range(0, len(wanted), REPLAY_CHUNK):
                yield await self.get(tenant, rule_id, wanted[i : i + REPLAY_CHUNK])
            return
        # Oldest first behind a moving cursor: a failed group stays behind it, so each letter
        # is tried at most once per replay.
        after = 0
        while True:
            page = await self.list(tenant, rule_id, after_id=after, limit=REPLAY_CHUNK)
            if not page:
                return
            after = page[-1].id
            yield page


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


def _letters(
    outputs: Sequence[Output], error: str, limits: DeadLetterLimits
) -> tuple[list[tuple[str, int]], int]:
    """(encoded output, size) of each output that fits `max_bytes`, and how many did not."""
    kept, dropped = [], 0
    for o in outputs:
        text = encode_output(o)
        size = len(text) + len(error)
        if size > limits.max_bytes:
            dropped += 1
        else:
            kept.append((text, size))
    return kept, dropped


class SqliteDeadLetters(DeadLetterStore):
    """Dead letters in a SQLite file (WAL, synchronous=FULL: written means kept). Per-rule
    totals live in their own table so a write checks the bounds without a scan."""

    def __init__(self, path: Path, limits: DeadLetterLimits | None = None) -> None:
        super().__init__(limits or DeadLetterLimits())
        self._db = SqliteDb(path, _SCHEMA)

    async def add(
        self,
        tenant: str,
        rule_id: str,
        action: str,
        outputs: Sequence[Output],
        error: str,
        attempts: int,
    ) -> int:
        error = error[:2000]
        kept, dropped = _letters(outputs, error, self.limits)
        now = int(time.time() * 1000)

        def write(db: Any) -> int:
            db.executemany(
                "INSERT INTO dead_letters (tenant, rule_id, action, output, error, attempts,"
                " failed_at_ms, size) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(tenant, rule_id, action, t, error, attempts, now, s) for t, s in kept],
            )
            db.execute(
                "INSERT INTO dead_letter_totals VALUES (?, ?, ?, ?) ON CONFLICT (tenant, rule_id)"
                " DO UPDATE SET count = count + excluded.count, bytes = bytes + excluded.bytes",
                (tenant, rule_id, len(kept), sum(s for _, s in kept)),
            )
            count, size = db.execute(
                "SELECT count, bytes FROM dead_letter_totals WHERE tenant=? AND rule_id=?",
                (tenant, rule_id),
            ).fetchone()
            evicted = 0
            if count > self.limits.max_count or size > self.limits.max_bytes:
                gone: list[int] = []
                freed = 0
                for rid, rsize in db.execute(
                    "SELECT id, size FROM dead_letters WHERE tenant=? AND rule_id=? ORDER BY id",
                    (tenant, rule_id),
                ):
                    if (
                        count - len(gone) <= self.limits.max_count
                        and size - freed <= self.limits.max_bytes
                    ):
                        break
                    gone.append(rid)
                    freed += rsize
                db.executemany("DELETE FROM dead_letters WHERE id=?", [(i,) for i in gone])
                db.execute(
                    "UPDATE dead_letter_totals SET count = count - ?, bytes = bytes - ?"
                    " WHERE tenant=? AND rule_id=?",
                    (len(gone), freed, tenant, rule_id),
                )
                evicted = len(gone)
            return evicted

        evicted = await self._db.run(lambda: self._db.tx(write))
        if evicted or dropped:
            log.warning(
                "dead_letters_dropped",
                extra={"tenant": tenant, "rule_id": rule_id, "dropped": evicted + dropped},
            )
        return evicted + dropped

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


class CassandraDeadLetters(DeadLetterStore):
    """Dead letters in Cassandra: one partition per rule, clustered by id (milliseconds and
    20 random bits: ordered by failure time, unique across rules service instances without
    coordination). The bounds are checked by reading the partition's count after a write, so
    two instances writing at once may overshoot a bound briefly; the next write corrects it.
    Driver calls run on a worker thread (failure path only: never on the message path)."""

    def __init__(
        self,
        contact_points: list[str],
        port: int = 9042,
        keyspace: str = "starling",
        replication: str = "SimpleStrategy:1",
        consistency: str = "LOCAL_QUORUM",
        limits: DeadLetterLimits | None = None,
    ) -> None:
        super().__init__(limits or DeadLetterLimits())
        from services.common.store.cassandra import CassandraBase
        from services.common.store.cassandra_schema import Migration

        class _Schema(CassandraBase):
            component = "rules_dead_letters"
            migrations = (
                Migration(
                    1,
                    "rule dead letters",
                    (
                        """CREATE TABLE IF NOT EXISTS rule_dead_letters (
                             tenant text, rule_id text, id bigint, action text, output text,
                             error text, attempts int, failed_at_ms bigint, size int,
                             PRIMARY KEY ((tenant, rule_id), id))
                           WITH CLUSTERING ORDER BY (id ASC)""",
                    ),
                ),
            )

            def prepare(self) -> None:
                pass

        self._base = _Schema(
            contact_points, port, keyspace, replication, consistency, "LOCAL_SERIAL"
        )
        self._s = self._base._session

    def _q(self, stmt: str, args: Sequence[Any] = ()) -> list[Any]:
        return list(self._s.execute(stmt, tuple(args)))

    async def add(
        self,
        tenant: str,
        rule_id: str,
        action: str,
        outputs: Sequence[Output],
        error: str,
        attempts: int,
    ) -> int:
        error = error[:2000]
        kept, dropped = _letters(outputs, error, self.limits)
        now = int(time.time() * 1000)

        def write() -> int:
            for text, size in kept:
                self._q(
                    "INSERT INTO rule_dead_letters (tenant, rule_id, id, action, output, error,"
                    " attempts, failed_at_ms, size) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                    (
                        tenant,
                        rule_id,
                        (now << 20) | random.getrandbits(20),
                        action,
                        text,
                        error,
                        attempts,
                        now,
                        size,
                    ),
                )
            rows = self._q(
                "SELECT id, size FROM rule_dead_letters WHERE tenant=%s AND rule_id=%s",
                (tenant, rule_id),
            )
            count, total = len(rows), sum(r.size for r in rows)
            gone = 0
            for r in rows:
                if count - gone <= self.limits.max_count and total <= self.limits.max_bytes:
                    break
                self._q(
                    "DELETE FROM rule_dead_letters WHERE tenant=%s AND rule_id=%s AND id=%s",
                    (tenant, rule_id, r.id),
                )
                gone += 1
                total -= r.size
            return gone

        return await asyncio.to_thread(write) + dropped

    def _letter(self, r: Any) -> DeadLetter:
        return DeadLetter(
            r.id,
            r.tenant,
            r.rule_id,
            r.action,
            decode_output(r.output),
            r.error,
            r.attempts,
            r.failed_at_ms,
            r.size,
        )

    async def list(
        self, tenant: str, rule_id: str, *, after_id: int = 0, limit: int = 100
    ) -> builtins.list[DeadLetter]:
        rows = await asyncio.to_thread(
            self._q,
            "SELECT * FROM rule_dead_letters WHERE tenant=%s AND rule_id=%s AND id>%s LIMIT %s",
            (tenant, rule_id, after_id, limit),
        )
        return [self._letter(r) for r in rows]

    async def get(self, tenant: str, rule_id: str, ids: Iterable[int]) -> builtins.list[DeadLetter]:
        wanted = sorted(set(ids))
        if not wanted:
            return []
        rows = await asyncio.to_thread(
            self._q,
            "SELECT * FROM rule_dead_letters WHERE tenant=%s AND rule_id=%s AND id IN %s",
            (tenant, rule_id, tuple(wanted)),
        )
        return sorted((self._letter(r) for r in rows), key=lambda d: d.id)

    async def delete(self, tenant: str, rule_id: str, ids: Iterable[int]) -> int:
        present = await self.get(tenant, rule_id, ids)
        if present:
            await asyncio.to_thread(
                self._q,
                "DELETE FROM rule_dead_letters WHERE tenant=%s AND rule_id=%s AND id IN %s",
                (tenant, rule_id, tuple(d.id for d in present)),
            )
        return len(present)

    async def purge(self, tenant: str, rule_id: str) -> int:
        n = (await self.stats(tenant, rule_id)).count
        await asyncio.to_thread(
            self._q,
            "DELETE FROM rule_dead_letters WHERE tenant=%s AND rule_id=%s",
            (tenant, rule_id),
        )
        return n

    async def stats(self, tenant: str, rule_id: str) -> DeadLetterStats:
        rows = await asyncio.to_thread(
            self._q,
            "SELECT size FROM rule_dead_letters WHERE tenant=%s AND rule_id=%s",
            (tenant, rule_id),
        )
        return DeadLetterStats(len(rows), sum(r.size for r in rows))

    async def close(self) -> None:
        await asyncio.to_thread(self._base._cluster.shutdown)
