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
    for _ in range(100):
        if notices and drops:
            break
        await asyncio.sleep(0.02)
    assert [n.last_seq for n in notices] == [3]
    assert [(d.type, d.client_id, d.message_dropped.count) for d in drops] == [
        (event_pb2.EVENT_TYPE_MESSAGE_DROPPED, "dev", 2)
    ]
    await nc.close()
    await store.close()
    await redis.aclose()
