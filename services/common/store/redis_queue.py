"""Redis Streams `QueueStore`: each queue a stream (one entry per seq, id `<seq>-0`) beside a
hash of its counters, a sorted set of recent message ids and one of released seqs; keys and
Lua scripts in redis_queue_lua.py. Chosen per tenant (services/common/store/tenant_queues.py,
setting `queue_store_by_tenant`); docs/storage.md, "Redis Streams queues".

Durability: as Redis is configured. A call returns once Redis executed its script; with
`appendonly yes` and `appendfsync always` that is after the AOF was fsynced, so an append the
queue service acknowledged (and so the PUBACK/PUBREC a publisher got) survives a crash of
Redis or of the machine; with `appendfsync everysec` (the default fsync policy) it survives a
crash of either process, and a power cut or OS crash loses about the last second; without an
AOF everything queued since the last snapshot goes with the Redis process. Replication is
asynchronous: a failover to a replica can lose what the replica had not received.

Invariants (as the SQLite store's, sqlite_queue.py):
- Every change of a queue is ONE Lua script on the queue's keys (one hash slot), so it is
  atomic: an append checks the fence, de-duplicates, applies the caps and writes the entries
  and counters in one step, one round trip per batch (an epoch's first write to a queue
  costs four more: the owner check below).
- `seq` grows by one per stored entry; entries are only deleted (ack: XTRIM MINID, drop-
  oldest: XDEL, drop: DEL), never rewritten; a released mark lives beside them.
- A message id is remembered MSGID_RETENTION_MS after its append (`:ids`, pruned by age on
  each append, the key itself expiring when the queue is idle): a retried append is a no-op.
- `delivered_through` only grows, raised by the script that reads or appends the entries.

Fencing (the partition's epoch is in another hash slot than the queue, so a script cannot
read both; the scheme is the Cassandra store's, cassandra_queue_owner.py, made simpler by
atomic scripts). A claim INCRs the partition's epoch, then *takes* every queue registered
under the partition (raises its `fence` to the new epoch) before it returns. An append whose
epoch is below the queue's fence or owner is FENCED. An epoch's first write to a queue (the
hash's `owner` below it) first registers the queue (SADD), creates its hash with a `born`
token (CREATE), then reads the partition's epoch: either that read preceded the claim (so the
claim lists the queue and raises its fence, which the append script then sees) or it sees
the new epoch (FENCED). The append script sets `owner` only if `born` is still the token this
writer saw, so a queue dropped (and perhaps created again) between the check and the script
makes the writer check again instead of passing on a check the claim could not see.

Forgetting (the partition's set stays near its live queues): a claim removes the queues whose
hash is gone (dropped), with a script that does so only while the partition's epoch is still
the claim's own: any writer that registered such a queue before that holds an older epoch and
is fenced by its own check. Between claims the owner sweeps the set the same way once it had
SWEEP_EVERY (or as many as the set held) registrations since: writers of its own epoch are in
this process, and register-and-create runs under the partition's lock, which each sweep step
holds from its look at the hashes to its removal, so it never forgets a queue being created.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from typing import Any

from redis.asyncio import Redis

from services.common import clock
from services.common.store import redis_queue_lua as lua
from services.common.store.ports_queue import (
    AppendOutcome,
    AppendReport,
    NewQueueItem,
    QueueChange,
    QueueState,
    StoredEntry,
)

MSGID_RETENTION_MS = 15 * 60 * 1000  # as the embedded store's de-duplication window
TAKE_AT_ONCE = 64  # queues a claim takes concurrently
MAX_CHECKS = 8  # owner checks of one append (each lost only to a drop racing it)
SWEEP_EVERY = 1000  # registrations in a partition between sweeps of its set (at least)
SCAN_CHUNK = 500
_OUTCOME = {
    "o": AppendOutcome.OK,
    "d": AppendOutcome.DUPLICATE,
    "f": AppendOutcome.FULL,
    "b": AppendOutcome.OVER_BYTES,
}


class RedisQueueStore:
    """Queues in Redis Streams (module docstring). Owns `redis` (closed by `close`);
    `key_prefix` keeps several queue clusters (or test runs) apart on one Redis."""

    def __init__(self, *, redis: Redis, key_prefix: str = "st:q:") -> None:
        self._r = redis
        self._prefix = key_prefix
        self._append = redis.register_script(lua.APPEND)
        self._read = redis.register_script(lua.READ)
        self._ack = redis.register_script(lua.ACK)
        self._drop = redis.register_script(lua.DROP)
        self._release = redis.register_script(lua.RELEASE)
        self._create = redis.register_script(lua.CREATE)
        self._take = redis.register_script(lua.TAKE)
        self._forget = redis.register_script(lua.FORGET)
        self._claimed: dict[int, int] = {}  # partition -> the epoch this store claimed last
        self._registered: dict[int, int] = {}  # registrations since the last claim or sweep
        self._kept: dict[int, int] = {}  # the set's size after it
        self._locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)

    def _keys(self, tenant: str, queue_id: str) -> list[str]:
        base = lua.queue_base(self._prefix, tenant, queue_id)
        return [base + s for s in lua.SUFFIXES]

    async def claim_partition(self, partition: int) -> int:
        epoch_key, queues_key = lua.partition_keys(self._prefix, partition)
        epoch = int(await self._r.incr(epoch_key))
        bases = [b.decode() async for b in self._r.sscan_iter(queues_key, count=500)]
        gone: list[str] = []
        for i in range(0, len(bases), TAKE_AT_ONCE):
            chunk = bases[i : i + TAKE_AT_ONCE]
            taken = await asyncio.gather(
                *(self._take(keys=[b + ":st"], args=[epoch]) for b in chunk)
            )
            gone += [b for b, t in zip(chunk, taken, strict=True) if not t]
        for i in range(0, len(gone), SCAN_CHUNK):
            chunk = gone[i : i + SCAN_CHUNK]
            await self._forget(keys=[epoch_key, queues_key], args=[epoch, *chunk])
        self._claimed[partition] = epoch
        self._registered[partition] = 0
        self._kept[partition] = len(bases) - len(gone)
        return epoch

    async def _sweep(self, partition: int, epoch: int) -> None:
        """Forget the partition's dropped queues while `epoch` (this store's) still owns it
        (module docstring, "Forgetting")."""
        epoch_key, queues_key = lua.partition_keys(self._prefix, partition)
        bases = [b.decode() async for b in self._r.sscan_iter(queues_key, count=SCAN_CHUNK)]
        kept = 0
        for i in range(0, len(bases), SCAN_CHUNK):
            chunk = bases[i : i + SCAN_CHUNK]
            async with self._locks[partition]:
                live = await asyncio.gather(*(self._r.exists(b + ":st") for b in chunk))
                gone = [b for b, n in zip(chunk, live, strict=True) if not n]
                if gone:
                    await self._forget(keys=[epoch_key, queues_key], args=[epoch, *gone])
            kept += len(chunk) - len(gone)
        self._kept[partition] = kept

    async def _check_owner(self, keys: list[str], partition: int, epoch: int) -> str | None:
        """An epoch's first write to a queue (module docstring): register, create, then read
        the partition's epoch. The hash's born token, None when the epoch is not the
        partition's any more."""
        epoch_key, queues_key = lua.partition_keys(self._prefix, partition)
        async with self._locks[partition]:  # not while a sweep looks at this partition
            await self._r.sadd(queues_key, keys[0][: -len(":st")])
            born = await self._create(keys=[keys[0]], args=[uuid.uuid4().hex])
        now = await self._r.get(epoch_key)
        if now is None or int(now) != epoch:
            return None
        if self._claimed.get(partition) == epoch:
            self._registered[partition] = self._registered.get(partition, 0) + 1
            if self._registered[partition] > max(SWEEP_EVERY, self._kept.get(partition, 0)):
                self._registered[partition] = 0
                await self._sweep(partition, epoch)
        return born.decode() if isinstance(born, bytes) else str(born)

    async def append(
        self,
        tenant: str,
        queue_id: str,
        items: list[NewQueueItem],
        partition: int,
        epoch: int,
        max_depth: int,
        drop_oldest: bool,
        mark_delivered: bool = False,
        room_bytes: int | None = None,
    ) -> AppendReport:
        keys = self._keys(tenant, queue_id)
        fenced = AppendReport([AppendOutcome.FENCED] * len(items))
        limits: list[Any] = [
            max_depth,
            int(drop_oldest),
            -1 if room_bytes is None else room_bytes,
            int(mark_delivered),
            clock.now_ms(),
            MSGID_RETENTION_MS,
        ]
        for it in items:
            limits += [it.message_id, it.qos, it.data, it.expires_at_ms]
        born = ""
        for _ in range(MAX_CHECKS):
            res = await self._append(keys=keys, args=[epoch, born, *limits])
            if res == b"F":
                return fenced
            if res != b"C":
                codes, last, dropped, depth, held = res
                outcomes = [_OUTCOME[c] for c in codes.decode()]
                return AppendReport(outcomes, int(last), int(dropped), int(depth), int(held))
            checked = await self._check_owner(keys, partition, epoch)
            if checked is None:
                return fenced
            born = checked
        raise RuntimeError(f"append to {queue_id!r}: owner check lost {MAX_CHECKS} times")

    async def read(
        self,
        tenant: str,
        queue_id: str,
        from_seq: int,
        limit: int,
        mark_delivered: bool = False,
        max_bytes: int = 0,
    ) -> tuple[list[StoredEntry], QueueState]:
        st, log, _, rel = self._keys(tenant, queue_id)
        args = [from_seq, max(limit, 0), int(mark_delivered), max_bytes]
        res = await self._read(keys=[st, log, rel], args=args)
        if limit <= 0:
            res = res[:6]
        last, acked, depth, dropped, dlv, held = (int(v) for v in res[:6])
        rows = res[6:]
        entries = [
            StoredEntry(
                int(rows[i]), int(rows[i + 1]), rows[i + 2], int(rows[i + 3]), bool(rows[i + 4])
            )
            for i in range(0, len(rows), 5)
        ]
        return entries, QueueState(last, acked, depth, dropped, dlv, held)

    async def ack(self, tenant: str, queue_id: str, through_seq: int) -> QueueChange:
        st, log, _, rel = self._keys(tenant, queue_id)
        depth, held = await self._ack(keys=[st, log, rel], args=[through_seq])
        return QueueChange(int(depth), int(held))

    async def mark_released(self, tenant: str, queue_id: str, seq: int) -> None:
        _, log, _, rel = self._keys(tenant, queue_id)
        await self._release(keys=[log, rel], args=[seq])

    async def drop(self, tenant: str, queue_id: str) -> QueueChange:
        depth, held = await self._drop(keys=self._keys(tenant, queue_id))
        return QueueChange(int(depth), int(held))

    async def state(self, tenant: str, queue_id: str) -> QueueState:
        st = self._keys(tenant, queue_id)[0]
        row = await self._r.hmget(st, ["last", "acked", "depth", "dropped", "dlv", "bytes"])
        return QueueState(*(int(v or 0) for v in row))

    async def depths(self) -> list[tuple[str, str, int, int]]:
        """One SCAN of the queues' hashes (every primary of a cluster), then their counters:
        as the SQL stores' scan of queue_state, now and then, never per message."""
        pattern = _glob_escape(self._prefix) + "{*}:st"
        keys = [k.decode() async for k in self._r.scan_iter(match=pattern, count=1000)]
        out: list[tuple[str, str, int, int]] = []
        for i in range(0, len(keys), 500):
            chunk = keys[i : i + 500]
            rows = await asyncio.gather(*(self._r.hmget(k, ["depth", "bytes"]) for k in chunk))
            for key, (depth, held) in zip(chunk, rows, strict=True):
                if int(depth or 0) or int(held or 0):
                    tenant, queue_id = lua.parse_base(self._prefix, key[: -len(":st")])
                    out.append((tenant, queue_id, int(depth or 0), int(held or 0)))
        return out

    async def close(self) -> None:
        await self._r.aclose()


def _glob_escape(text: str) -> str:
    """`text` matched literally by a Redis glob pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
