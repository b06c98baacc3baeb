"""The queue service's Append against SQLite and a real nats-server: notices to the holding
node, and the depth limit's drops counted and evented."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from nats.aio.msg import Msg
from redis.asyncio import Redis

from services.common.bus import subjects
from services.common.bus.client import connect
from services.common.store.sqlite_queue import SqliteQueueStore
from services.queue.api import QueueApi
from services.queue.config import QueueSettings
from services.queue.leases import LeaseTable
from services.queue.ownership import Partitions
from starling.common.v1 import event_pb2
from starling.common.v1.message_pb2 import RoutedMessage
from starling.queue.v1 import queue_pb2 as pb
from tests.poll import eventually


async def test_append_notifies_and_events_depth_drops(
    nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    settings = QueueSettings(max_queue_depth=3, depth_policy="reject_newest", metrics_port=-1)
    store = SqliteQueueStore(tmp_path / "q.db")
    redis = Redis.from_url(redis_url)
    leases = LeaseTable(redis, "q-test", settings.queue_partitions, 5000, f"t:{uuid.uuid4()}:")
    parts = Partitions(settings, "q-test", leases, store)
    await parts.tick()  # alone: every partition
    nc = await connect(nats_url, "queue-test")
    api = QueueApi(store, parts, settings, nc)
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
    """A LimitsCopies stand-in: every tenant has max_queued_bytes `cap`."""

    def __init__(self, cap: int) -> None:
        self.cap = cap

    async def fetch(self, tenant: str) -> object:
        from services.common.limits_copies import TenantLimits
        from services.quota.client import Limits

        t = TenantLimits(tenant)
        t.limits, t.known = Limits(max_queued_bytes=self.cap), True
        return t


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
    parts = Partitions(settings, "q-test", leases, store)
    await parts.tick()
    nc = await connect(nats_url, "queue-test")
    api = QueueApi(store, parts, settings, nc, _Limits(1000))  # type: ignore[arg-type]
    await api.depths.scan(store)

    def request(tenant: str, queues: list[str], tag: str) -> pb.AppendRequest:
        m = RoutedMessage(tenant=tenant, topic="a", payload=b"x" * 180, message_id=tag)
        return pb.AppendRequest(
            tenant=tenant, entries=[pb.NewEntry(queue_id=q, qos=1, message=m) for q in queues]
        )

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
