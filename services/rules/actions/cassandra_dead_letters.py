"""The dead-letter store in Cassandra, for a mesh on Cassandra: one partition per rule, each
write bounded by the rule's limits after the fact."""

from __future__ import annotations

import asyncio
import builtins
import random
from collections.abc import Iterable, Sequence
from typing import Any

from services.rules.actions.dead_letter_codec import EncodedBatch, decode_output
from services.rules.actions.dead_letter_store import (
    DeadLetter,
    DeadLetterLimits,
    DeadLetterStats,
    DeadLetterStore,
    oldest_to_drop,
)

_TABLE = """CREATE TABLE IF NOT EXISTS rule_dead_letters (
                             tenant text, rule_id text, id bigint, action text, output text,
                             error text, attempts int, failed_at_ms bigint, size int,
                             PRIMARY KEY ((tenant, rule_id), id))
                           WITH CLUSTERING ORDER BY (id ASC)"""


def _letter(r: Any) -> DeadLetter:
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
            migrations = (Migration(1, "rule dead letters", (_TABLE,)),)

            def prepare(self) -> None:
                pass

        self._base = _Schema(
            contact_points=contact_points,
            port=port,
            keyspace=keyspace,
            replication=replication,
            consistency=consistency,
            serial_consistency="LOCAL_SERIAL",
        )
        self._s = self._base._session

    def _q(self, stmt: str, args: Sequence[Any] = ()) -> list[Any]:
        return list(self._s.execute(stmt, tuple(args)))

    async def _write_batch(self, batch: EncodedBatch) -> int:
        return await asyncio.to_thread(self._write, batch)

    def _write(self, b: EncodedBatch) -> int:
        """Insert the batch, then delete the rule's oldest letters past its limits; how many
        were deleted. Runs on a worker thread."""
        now = b.failed_at_ms
        for text, size in b.letters:
            self._q(
                "INSERT INTO rule_dead_letters (tenant, rule_id, id, action, output, error,"
                " attempts, failed_at_ms, size) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                (
                    b.tenant,
                    b.rule_id,
                    (now << 20) | random.getrandbits(20),
                    b.action,
                    text,
                    b.error,
                    b.attempts,
                    now,
                    size,
                ),
            )
        rows = self._q(
            "SELECT id, size FROM rule_dead_letters WHERE tenant=%s AND rule_id=%s",
            (b.tenant, b.rule_id),
        )
        count, total = len(rows), sum(r.size for r in rows)
        gone, _ = oldest_to_drop(((r.id, r.size) for r in rows), count, total, self.limits)
        for rid in gone:
            self._q(
                "DELETE FROM rule_dead_letters WHERE tenant=%s AND rule_id=%s AND id=%s",
                (b.tenant, b.rule_id, rid),
            )
        return len(gone)

    async def list(
        self, tenant: str, rule_id: str, *, after_id: int = 0, limit: int = 100
    ) -> builtins.list[DeadLetter]:
        rows = await asyncio.to_thread(
            self._q,
            "SELECT * FROM rule_dead_letters WHERE tenant=%s AND rule_id=%s AND id>%s LIMIT %s",
            (tenant, rule_id, after_id, limit),
        )
        return [_letter(r) for r in rows]

    async def get(self, tenant: str, rule_id: str, ids: Iterable[int]) -> builtins.list[DeadLetter]:
        wanted = sorted(set(ids))
        if not wanted:
            return []
        rows = await asyncio.to_thread(
            self._q,
            "SELECT * FROM rule_dead_letters WHERE tenant=%s AND rule_id=%s AND id IN %s",
            (tenant, rule_id, tuple(wanted)),
        )
        return sorted((_letter(r) for r in rows), key=lambda d: d.id)

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
