"""The router's publish path without its servicers: `Publisher`, `Retaining`,
`DelayedMessages` and `DelayScheduler` wired as services/router/main.py wires them, over a
real SQLite store, the queue service of tests/inproc.py and a real NATS server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from services.common.refusals import Refusals
from services.common.route_table import RouteResult, RouteTable
from services.common.store.sqlite_router import SqliteRouterStore
from services.queue.client import QueueClient
from services.router.delaying import DelayedMessages, DelayScheduler
from services.router.fencing import RouteFence
from services.router.limits import Caps
from services.router.publishing import Publisher
from services.router.quota_events import QuotaEvents
from services.router.retained import RetainedIndex
from services.router.retaining import Retaining
from starling.common.v1.message_pb2 import RoutedMessage
from tests.inproc import Core


@dataclass(frozen=True)
class Router:
    """One router's parts (a start over the store; `scheduler` is not running)."""

    publisher: Publisher
    delayed: DelayedMessages
    scheduler: DelayScheduler
    retained: RetainedIndex
    refusals: Refusals
    store: SqliteRouterStore

    async def route(self, *messages: RoutedMessage) -> list[RouteResult]:
        results, _ = await self.publisher.accept(list(messages))
        return results


# A router (re)start over tmp_path/router.db with these caps, its store of this type.
RouterFactory = Callable[..., Awaitable[Router]]


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    c = await nats.connect(nats_url)
    yield c
    await c.close()


@pytest.fixture
async def router(core: Core, nc: Client, tmp_path: Path) -> AsyncIterator[RouterFactory]:
    opened: list[tuple[SqliteRouterStore, QueueClient]] = []

    async def start(caps: Caps, store_type: type[SqliteRouterStore] = SqliteRouterStore) -> Router:
        store = store_type(tmp_path / "router.db")
        queues = QueueClient(core.queue)
        opened.append((store, queues))
        refusals = Refusals()
        quota = QuotaEvents(refusals=refusals, nats=nc)
        retained = RetainedIndex()
        retaining = Retaining(index=retained, store=store, caps=caps, quota=quota)
        delayed = DelayedMessages(store=store, caps=caps, quota=quota)
        publisher = Publisher(
            table=RouteTable(),
            queues=queues,
            fence=RouteFence(queues=queues, nats=nc),
            retaining=retaining,
            delayed=delayed,
            include_qos0=False,
        )
        await retaining.load()
        await delayed.load()
        scheduler = DelayScheduler(held=delayed, route=publisher.accept, nats=nc)
        return Router(publisher, delayed, scheduler, retained, refusals, store)

    yield start
    for store, queues in opened:
        await queues.close()
        await store.close()
