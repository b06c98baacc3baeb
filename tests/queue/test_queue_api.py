"""The queue service's Append against SQLite and a real nats-server: notices to the holding
node, and the depth limit's drops counted and evented."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg
from redis.asyncio import Redis

from services.common.bus import subjects
from services.common.bus.client import connect
from services.common.store.sqlite_queue import SqliteQueueStore
from services.queue.api import QueueApi
from services.queue.config import QueueSettings
from services.queue.depths import QueueDepths
from services.queue.leases import LeaseTable
from services.queue.ownership import Partitions
from services.queue.readers import Readers
from starling.common.v1 import event_pb2
from starling.common.v1.message_pb2 import RoutedMessage
from starling.queue.v1 import queue_pb2 as pb
from tests.poll import eventually, holds_within_async


def _owned(parts: Partitions) -> dict[str, Any]:
    """The readers and depths of `parts`' partitions, as services/queue/main.py makes them."""
    return {"readers": Readers(), "depths": QueueDepths(parts.count, lambda: parts.epochs.keys())}


async def test_append_notifies_and_events_depth_drops(
    nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    settings = QueueSettings(max_queue_depth=3, depth_policy="reject_newest", metrics_port=-1)
    store = SqliteQueueStore(tmp_path / "q.db")
    redis = Redis.from_url(redis_url)
    leases = LeaseTable(redis, "q-test", settings.queue_partitions, 5000, f"t:{uuid.uuid4()}:")
    parts = Partitions(settings=settings, instance_id="q-test", leases=leases, store=store)
    await parts.tick()  # alone: every partition
    nc = await connect(nats_url, "queue-test")
    api = QueueApi(store=store, parts=parts, settings=settings, nats=nc, **_owned(parts))
    notices: list[pb.QueueNotice] = []
    drops: list[event_pb2.Event] = []

    async def on_notice(m: Msg) -> None:
        notices.append(pb.QueueNotice.FromString(m.data))

    async def on_event(m: Msg) -> None:
        drops.append(event_pb2.Event.FromString(m.data))

    await nc.subscribe(subjects.queue_notice("t", "dev#1"), cb=on_notice)
    await nc.subscribe(subjects.event("t", "message_dropped"), cb=on_event)
    entries = [
        pb.NewEntry(
            queue_id="dev#1",
            qos=1,
            message=RoutedMessage(tenant="t", topic="a", message_id=f"m{i}"),
        )
        for i in range(5)
    ]
    resp = await api.Append(pb.AppendRequest(tenant="t", entries=entries), None)  # type: ignore[arg-type]
    assert list(resp.results) == [pb.APPEND_RESULT_OK] * 3 + [pb.APPEND_RESULT_QUEUE_FULL] * 2
    await eventually(lambda: notices and drops, 5, "the notice and the drop event")
    assert [n.last_seq for n in notices] == [3]
    assert [(d.type, d.client_id, d.message_dropped.count) for d in drops] == [
        (event_pb2.EVENT_TYPE_MESSAGE_DROPPED, "dev", 2)
    ]
    await nc.close()
    await store.close()
    await redis.aclose()


class _Limits:
    """A LimitsCopies stand-in: every tenant has max_queued_bytes `cap` and max_queue_depth
    `depth` (0: none)."""

    def __init__(self, cap: int, depth: int = 0) -> None:
        self.cap = cap
        self.depth = depth

    async def fetch(self, tenant: str) -> object:
        from services.common.limits_copies import TenantLimits
        from services.quota.client import Limits

        t = TenantLimits(tenant)
        limits = Limits(max_queued_bytes=self.cap, max_queue_depth=self.depth)
        t.limits, t.known = limits, True
        return t


async def test_a_tenants_max_queue_depth_refuses_and_drops_nothing(
    nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    """The tenant's max_queue_depth, below the setting's drop_oldest cap, binds: entries past
    it are refused (the publisher is told), counted as refusals; no older entry is dropped,
    no drop event, no drop count."""
    settings = QueueSettings(max_queue_depth=10, depth_policy="drop_oldest", metrics_port=-1)
    store = SqliteQueueStore(tmp_path / "q.db")
    redis = Redis.from_url(redis_url)
    leases = LeaseTable(redis, "q-test", settings.queue_partitions, 5000, f"t:{uuid.uuid4()}:")
    parts = Partitions(settings=settings, instance_id="q-test", leases=leases, store=store)
    await parts.tick()
    nc = await connect(nats_url, "queue-test")
    limits = _Limits(0, depth=2)
    api = QueueApi(
        store=store, parts=parts, settings=settings, nats=nc, limits=limits, **_owned(parts)
    )  # type: ignore[arg-type]
    drops: list[Msg] = []

    async def on_event(m: Msg) -> None:
        drops.append(m)

    await nc.subscribe(subjects.event("t", "message_dropped"), cb=on_event)
    entries = [
        pb.NewEntry(
            queue_id="dev#1",
            qos=1,
            message=RoutedMessage(tenant="t", topic="a", message_id=f"m{i}"),
        )
        for i in range(4)
    ]
    resp = await api.Append(pb.AppendRequest(tenant="t", entries=entries), None)  # type: ignore[arg-type]
    refused = [pb.APPEND_RESULT_QUOTA_EXCEEDED] * 2
    assert list(resp.results) == [pb.APPEND_RESULT_OK] * 2 + refused
    assert api.refusals.get("max_queue_depth", "t") == 2
    read = await api.Read(pb.ReadRequest(tenant="t", queue_id="dev#1", from_seq=1), None)  # type: ignore[arg-type]
    assert [e.message.message_id for e in read.entries] == ["m0", "m1"]
    assert not await holds_within_async(lambda: drops, 0.3)
    assert api.dropped_by_tenant == {}
    await nc.close()
    await store.close()
    await redis.aclose()


def _bytes_request(tenant: str, queues: list[str], tag: str) -> pb.AppendRequest:
    """One 180-byte message of `tenant` to each of `queues`."""
    m = RoutedMessage(tenant=tenant, topic="a", payload=b"x" * 180, message_id=tag)
    return pb.AppendRequest(
        tenant=tenant, entries=[pb.NewEntry(queue_id=q, qos=1, message=m) for q in queues]
    )


async def test_concurrent_appends_share_the_tenants_queued_bytes(
    nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Appends of one tenant to many queues, in one request and in requests at once, see
    each other's bytes before the store has them: together they stay within the limit;
    acks give the room back; another tenant has its own."""
    settings = QueueSettings(metrics_port=-1)
    store = SqliteQueueStore(tmp_path / "q.db")
    redis = Redis.from_url(redis_url)
    leases = LeaseTable(redis, "q-test", settings.queue_partitions, 5000, f"t:{uuid.uuid4()}:")
    parts = Partitions(settings=settings, instance_id="q-test", leases=leases, store=store)
    await parts.tick()
    nc = await connect(nats_url, "queue-test")
    limits = _Limits(1000)
    api = QueueApi(
        store=store, parts=parts, settings=settings, nats=nc, limits=limits, **_owned(parts)
    )  # type: ignore[arg-type]
    await api.depths.scan(store)

    request = _bytes_request
    size = len(
        pb.QueueEntry(
            message=request("t", ["q"], "m0").entries[0].message, qos=1
        ).SerializeToString()
    )
    assert 180 < size < 200  # five of the eight entries fit in 1000 bytes
    calls = [
        api.Append(request("t", [f"c{i}#1", f"d{i}#1"], f"m{i}"), None)  # type: ignore[arg-type]
        for i in range(4)
    ]
    results = [list(r.results) for r in await asyncio.gather(*calls)]
    ok = sum(r.count(pb.APPEND_RESULT_OK) for r in results)
    refused = sum(r.count(pb.APPEND_RESULT_QUOTA_EXCEEDED) for r in results)
    assert (ok, refused) == (5, 3)
    assert api.depths.held_bytes("t", 3.0) == ok * size
    assert api.refusals.get("max_queued_bytes", "t") == refused
    other = await api.Append(request("u", ["c0#1"], "m0"), None)  # type: ignore[arg-type]
    assert list(other.results) == [pb.APPEND_RESULT_OK]
    # The subscribers acknowledge: room again.
    for i in range(4):
        for q in (f"c{i}#1", f"d{i}#1"):
            await api.Ack(pb.AckRequest(tenant="t", queue_id=q, through_seq=1), None)  # type: ignore[arg-type]
    assert api.depths.held_bytes("t", 3.0) == 0
    again = await api.Append(request("t", ["c9#1"], "m9"), None)  # type: ignore[arg-type]
    assert list(again.results) == [pb.APPEND_RESULT_OK]
    await nc.close()
    await store.close()
    await redis.aclose()
