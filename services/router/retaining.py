"""The router's retained messages: stored as they are published (deleted by an empty payload
[MQTT-3.3.1-10]) within the tenant's retained caps, and read back from the store.

The index in memory (services/router/retained.py) is what lookups read; every write goes to
the store too. Several instances: before each lookup and cap check the tenant's index is
made the store's again if another instance wrote since (services/router/cluster.py
`Generations`), and each write of ours tells the others. Usage is the index's own sizes, so
a cap holds across restarts (every record is loaded at start).
"""

from __future__ import annotations

from typing import NamedTuple

from services.common.clock import now_ms
from services.common.limits_copies import LimitsCopies
from services.common.store.ports_router import RetainedRecord, RouterStore
from services.router.cluster import Generations
from services.router.limits import Caps, fits
from services.router.quota_events import QuotaEvents
from services.router.retained import Retained, RetainedIndex, is_sys
from starling.common.v1.message_pb2 import RoutedMessage

# A tenant at a retained cap has its expired retained messages purged at most this often.
PURGE_EVERY_MS = 1000


class _RetainedCaps(NamedTuple):
    """A tenant's retained caps (0: none) and the refusal label of each."""

    messages: int
    messages_label: str
    bytes: int
    bytes_label: str


def _expires_at_ms(m: RoutedMessage) -> int:
    if m.properties.HasField("message_expiry_interval_s"):
        return m.published_at_ms + m.properties.message_expiry_interval_s * 1000
    return 0


def _key(tenant: str) -> str:
    return "retained:" + tenant


class Retaining:
    """Call `load` once at start, `fresh` before reading the index, `retain` for each
    publish with RETAIN, `delete` for the admin API's deletes."""

    def __init__(
        self,
        *,
        index: RetainedIndex,
        store: RouterStore,
        caps: Caps,
        quota: QuotaEvents,
        limits: LimitsCopies | None = None,
        generations: Generations | None = None,
    ) -> None:
        self._index = index
        self._store = store
        self._caps = caps
        self._quota = quota
        # Tenants' retained quotas (quota service), below the caps of the settings.
        self._limits = limits
        # Several router instances (services/router/cluster.py); None: this one is alone.
        self._generations = generations
        self._purged_at: dict[str, int] = {}  # tenant -> last purge of expired retained

    async def load(self) -> None:
        """Every retained message of the store into the index."""
        for r in await self._store.all_retained():
            self._index.put(r.tenant, r.topic, Retained(r.data, r.expires_at_ms))

    async def fresh(self, tenant: str) -> None:
        """Several instances: the tenant's retained index is the store's (reloaded if another
        instance wrote since we looked)."""
        if self._generations is None:
            return
        g = await self._generations.stale(_key(tenant))
        if g is None:
            return
        self._index.drop_tenant(tenant)
        for r in await self._store.tenant_retained(tenant):
            self._index.put(r.tenant, r.topic, Retained(r.data, r.expires_at_ms))
        self._generations.adopt(_key(tenant), g)

    async def retain(self, m: RoutedMessage) -> bool:
        """Store (or, for an empty payload, delete [MQTT-3.3.1-10]) the retained message;
        False when the tenant's retained caps refuse it (a delete is never refused)."""
        if not m.payload:
            await self.delete(m.tenant, m.topic)
            return True
        await self.fresh(m.tenant)
        data = m.SerializeToString()
        # `$SYS` figures (services/metrics/sys_publisher.py) are the server's, never refused
        # (nor do they make the router ask for the tenant's limits).
        if not is_sys(m.topic):
            caps = await self._retained_caps(m.tenant)
            if not await self._fits(m.tenant, m.topic, len(data), caps):
                await self._quota.exceeded(
                    m.tenant, self._limit(m.tenant, m.topic, len(data), caps)
                )
                return False
        await self._store.put_retained(RetainedRecord(m.tenant, m.topic, data, _expires_at_ms(m)))
        self._index.put(m.tenant, m.topic, Retained(data, _expires_at_ms(m)))
        await self._wrote(m.tenant)
        return True

    async def delete(self, tenant: str, topic: str) -> bool:
        """Forget the retained message of `topic`; True when the index held one."""
        await self.fresh(tenant)
        deleted = self._index.delete(tenant, topic)
        await self._store.delete_retained(tenant, topic)
        await self._wrote(tenant)
        return deleted

    async def _wrote(self, tenant: str) -> None:
        """Several instances: the others learn that the store changed under their copy."""
        if self._generations is not None:
            await self._generations.wrote(_key(tenant))

    async def _retained_caps(self, tenant: str) -> _RetainedCaps:
        """The tenant's retained caps: the setting's, or its quota's where that is lower."""
        caps = _RetainedCaps(
            self._caps.retained_messages,
            "retained_messages",
            self._caps.retained_bytes,
            "retained_bytes",
        )
        if self._limits is None:
            return caps
        quota = (await self._limits.fetch(tenant)).limits
        n, size = quota.max_retained_messages, quota.max_retained_bytes
        if n and (not caps.messages or n < caps.messages):
            caps = caps._replace(messages=n, messages_label="max_retained_messages")
        if size and (not caps.bytes or size < caps.bytes):
            caps = caps._replace(bytes=size, bytes_label="max_retained_bytes")
        return caps

    def _growth(self, tenant: str, topic: str, nbytes: int) -> tuple[int, int]:
        old = self._index.get(tenant, topic)
        return (1, nbytes) if old is None else (0, nbytes - len(old.data))

    def _limit(self, tenant: str, topic: str, nbytes: int, caps: _RetainedCaps) -> str:
        """Which retained cap a refused message hit (its refusal label)."""
        add_count, _ = self._growth(tenant, topic, nbytes)
        cap = caps.messages
        if cap and add_count and self._index.count(tenant) + add_count > cap:
            return caps.messages_label
        return caps.bytes_label

    async def _fits(self, tenant: str, topic: str, nbytes: int, caps: _RetainedCaps) -> bool:
        """Within the caps, counting expired messages out: at a cap, the tenant's expired
        retained messages are purged first (at most once per PURGE_EVERY_MS, so a client
        hammering a full tenant does not make every publish walk its whole index)."""
        for attempt in (0, 1):
            add_count, add_bytes = self._growth(tenant, topic, nbytes)
            if fits(
                self._index.count(tenant),
                self._index.size(tenant),
                add_count,
                add_bytes,
                caps.messages,
                caps.bytes,
            ):
                return True
            if attempt or not await self._purge_expired(tenant):
                return False
        return False

    async def _purge_expired(self, tenant: str) -> bool:
        """Forget the tenant's expired retained messages; True when any were."""
        now = now_ms()
        if now - self._purged_at.get(tenant, -PURGE_EVERY_MS) < PURGE_EVERY_MS:
            return False
        self._purged_at[tenant] = now
        topics = self._index.expired(tenant, now)
        for topic in topics:
            self._index.delete(tenant, topic)
            await self._store.delete_retained(tenant, topic)
        if topics:
            await self._wrote(tenant)
        return bool(topics)
