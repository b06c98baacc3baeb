"""The delayed-message scheduler outlives a failing store: a delete that fails after a due
message was published is logged, the message fires again, and later delayed messages are
still published. The router's parts of tests/router/conftest.py (real SQLite, queue
service, NATS); the only fault is one injected into the real store's delete."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from pathlib import Path

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.route_table import RouteResult
from services.common.store.ports_router import DelayedRecord
from services.common.store.sqlite_router import SqliteRouterStore
from services.common.topics import filter_to_subjects
from services.router.limits import Caps
from starling.common.v1.message_pb2 import Publisher, RoutedBatch, RoutedMessage
from tests.poll import eventually
from tests.router.conftest import RouterFactory


class DeleteFailsOnce(SqliteRouterStore):
    """The real store, except that its first delete of a delayed message fails."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.failed = False

    async def delete_delayed(self, tenant: str, id: str) -> bool:
        if not self.failed:
            self.failed = True
            raise sqlite3.OperationalError("database is locked")
        return await super().delete_delayed(tenant, id)


def delayed(tenant: str, topic: str, payload: bytes) -> RoutedMessage:
    return RoutedMessage(
        tenant=tenant,
        topic=f"$delayed/0/{topic}",
        payload=payload,
        qos=1,
        publisher=Publisher(client_id="pub", node_id="n1"),
        published_at_ms=int(time.time() * 1000),
        message_id=uuid.uuid4().hex,
    )


async def test_a_failed_delete_does_not_stop_the_scheduler(
    router: RouterFactory, nc: Client
) -> None:
    t = f"dly{uuid.uuid4().hex[:6]}"
    received: list[bytes] = []

    async def on_publish(msg: Msg) -> None:
        received.extend(m.payload for m in RoutedBatch.FromString(msg.data).messages)

    (subject,) = filter_to_subjects(t, "due/+")  # where a node's subscriber would listen
    sub = await nc.subscribe(subject, cb=on_publish)
    r = await router(Caps(), DeleteFailsOnce)
    scheduler = asyncio.create_task(r.scheduler.run())
    try:
        assert await r.route(delayed(t, "due/first", b"first")) == [RouteResult.STORED]
        await eventually(lambda: b"first" in received, 5, "the first delayed message")
        assert isinstance(r.store, DeleteFailsOnce) and r.store.failed

        assert await r.route(delayed(t, "due/second", b"second")) == [RouteResult.STORED]
        await eventually(lambda: b"second" in received, 5, lambda: f"second among {received}")
        # The first was tried again: published again (at least once), then deleted.
        await eventually(lambda: not r.delayed.of_tenant(t), 5, "nothing held any more")
        assert await r.store.all_delayed() == []
        assert not scheduler.done()
    finally:
        scheduler.cancel()
        await sub.unsubscribe()


class DeleteWaits(SqliteRouterStore):
    """The real store, except that a delete of a delayed message waits for `go`."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.deleting = asyncio.Event()
        self.go = asyncio.Event()
        self.deleted = asyncio.Event()

    async def delete_delayed(self, tenant: str, id: str) -> bool:
        self.deleting.set()
        await self.go.wait()
        found = await super().delete_delayed(tenant, id)
        self.deleted.set()
        return found


def will(tenant: str, payload: bytes) -> RoutedMessage:
    return RoutedMessage(
        tenant=tenant,
        topic="wills/dev",
        payload=payload,
        qos=1,
        publisher=Publisher(client_id="dev", node_id="n1"),
        published_at_ms=int(time.time() * 1000),
        message_id=uuid.uuid4().hex,
    )


def payloads(records: list[DelayedRecord]) -> list[bytes]:
    return [RoutedMessage.FromString(d.data).payload for d in records]


async def test_a_will_that_replaces_one_being_published_is_kept(router: RouterFactory) -> None:
    """The client's first will fires; while it is being deleted after its publish, the client
    comes back and goes again with a new delayed will. The new will stays held and stored."""
    t = f"dly{uuid.uuid4().hex[:6]}"
    r = await router(Caps(), DeleteWaits)
    store = r.store
    assert isinstance(store, DeleteWaits)
    scheduler = asyncio.create_task(r.scheduler.run())
    try:
        await r.delayed.delay_will(will(t, b"first"), 0)
        await asyncio.wait_for(store.deleting.wait(), 5)  # published, now being deleted
        await r.delayed.delay_will(will(t, b"second"), 3600)
        store.go.set()
        await asyncio.wait_for(store.deleted.wait(), 5)

        async def kept() -> bool:
            stored = [d for d in await store.all_delayed() if d.tenant == t]
            return payloads(stored) == payloads(r.delayed.of_tenant(t)) == [b"second"]

        await eventually(kept, 5, lambda: f"held: {payloads(r.delayed.of_tenant(t))}")
    finally:
        scheduler.cancel()
