"""`TenantQueueStores`: the `QueueStore` that sends each tenant's queues to the backend kind
chosen for it (`queue_store_by_tenant`, else `queue_store_default`): "store" (the configured
store: SQLite or Cassandra) or "redis" (Redis Streams, redis_queue.py). open.py builds it when
any tenant is on Redis (or `queue_redis_url` is set); otherwise the store is used alone.

Theory of operation:
- Calls naming a tenant go to that tenant's backend; `claim_partition`, `depths` and `close`
  go to every backend.
- Epochs: each backend fences with epochs of its own. A claim claims the partition in every
  backend, the "store" kind first, and returns the store's epoch (it grows with every claim of
  every instance, as callers expect); the other backends' epochs of that claim are kept here,
  per partition, for the appends made with it. An append with an epoch this process did not
  get from a claim (or one forgotten, KEEP_CLAIMS later) is FENCED, as an old epoch is. Two
  instances claiming one partition at the same moment may each end up fenced in one backend:
  refused appends until the next claim, never a stale write (each backend fences on its own).
- A tenant's kind must not change while a backend holds entries of it in a queue: before its
  first claim (the queue service claims at start, before serving) every backend's `depths`
  is scanned, and a tenant with entries in a backend that is not its kind stops the service
  with `QueueKindError`, naming the setting. Drain a tenant's queues before moving it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from services.common.store.ports_queue import (
    AppendOutcome,
    AppendReport,
    NewQueueItem,
    QueueChange,
    QueueState,
    QueueStore,
    StoredEntry,
)

KINDS = ("store", "redis")  # the primary (whose epochs callers see) first
KEEP_CLAIMS = 4  # claims remembered per partition (older epochs are fenced anyway)


class QueueKindError(Exception):
    """A tenant's queues are in another backend than the settings choose for it."""


class TenantQueueStores:
    """Dispatches each call to the tenant's backend (module docstring). `stores`: kind ->
    backend, the "store" kind included; `by_tenant`: tenant -> kind; `default_kind` for the
    rest."""

    def __init__(
        self,
        *,
        stores: Mapping[str, QueueStore],
        by_tenant: Mapping[str, str],
        default_kind: str = "store",
    ) -> None:
        for kind in (default_kind, *by_tenant.values()):
            if kind not in stores:
                raise ValueError(f"queue store kind {kind!r} is not open (have {list(stores)})")
        self._stores = dict(stores)
        self._order = sorted(stores, key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS))
        self._by_tenant = dict(by_tenant)
        self._default = default_kind
        self._claims: dict[int, dict[int, dict[str, int]]] = {}
        self._checked = False
        self._check_lock = asyncio.Lock()

    def kind_of(self, tenant: str) -> str:
        return self._by_tenant.get(tenant, self._default)

    def _of(self, tenant: str) -> QueueStore:
        return self._stores[self.kind_of(tenant)]

    async def check_kinds(self) -> None:
        """Raise `QueueKindError` if a backend holds entries of a tenant whose kind is
        another one (module docstring)."""
        wrong: list[str] = []
        for kind, store in self._stores.items():
            tenants = sorted({t for t, _, _, _ in await store.depths() if self.kind_of(t) != kind})
            wrong += [f"{t!r} has queued entries in {kind!r}" for t in tenants[:10]]
        if wrong:
            raise QueueKindError(
                "queue_store_by_tenant (STARLING_QUEUE_STORE_BY_TENANT) / queue_store_default "
                "moves tenants whose queues are not drained: "
                + "; ".join(wrong)
                + ". Put them back, drain their queues, then move them."
            )

    async def claim_partition(self, partition: int) -> int:
        if not self._checked:
            async with self._check_lock:
                if not self._checked:
                    await self.check_kinds()
                    self._checked = True
        epochs = {kind: await self._stores[kind].claim_partition(partition) for kind in self._order}
        epoch = epochs[self._order[0]]
        claims = self._claims.setdefault(partition, {})
        claims[epoch] = epochs
        for old in sorted(claims)[:-KEEP_CLAIMS]:
            del claims[old]
        return epoch

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
        kind = self.kind_of(tenant)
        epochs = self._claims.get(partition, {}).get(epoch)
        if epochs is None:
            return AppendReport([AppendOutcome.FENCED] * len(items))
        return await self._stores[kind].append(
            tenant,
            queue_id,
            items,
            partition,
            epochs[kind],
            max_depth,
            drop_oldest,
            mark_delivered,
            room_bytes,
        )

    async def read(
        self,
        tenant: str,
        queue_id: str,
        from_seq: int,
        limit: int,
        mark_delivered: bool = False,
        max_bytes: int = 0,
    ) -> tuple[list[StoredEntry], QueueState]:
        return await self._of(tenant).read(
            tenant, queue_id, from_seq, limit, mark_delivered, max_bytes
        )

    async def ack(self, tenant: str, queue_id: str, through_seq: int) -> QueueChange:
        return await self._of(tenant).ack(tenant, queue_id, through_seq)

    async def mark_released(self, tenant: str, queue_id: str, seq: int) -> None:
        await self._of(tenant).mark_released(tenant, queue_id, seq)

    async def drop(self, tenant: str, queue_id: str) -> QueueChange:
        return await self._of(tenant).drop(tenant, queue_id)

    async def depths(self) -> list[tuple[str, str, int, int]]:
        out: list[tuple[str, str, int, int]] = []
        for kind, store in self._stores.items():
            out += [row for row in await store.depths() if self.kind_of(row[0]) == kind]
        return out

    async def state(self, tenant: str, queue_id: str) -> QueueState:
        return await self._of(tenant).state(tenant, queue_id)

    async def close(self) -> None:
        for store in self._stores.values():
            await store.close()
