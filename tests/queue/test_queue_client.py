"""The queue clients against the queue service in this process (SQLite, a real nats-server):
entries come back as `Message`s carrying the entry's QoS, retain flag and expiry."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest

from services.common.message import Message
from services.common.rpc.errors import InvalidArgumentError, PermissionDeniedError
from services.queue.client import (
    AppendResult,
    NewEntry,
    QueueAdminClient,
    QueueClient,
    QueueEntry,
    QueueRead,
    QueueStats,
    queue_id,
)
from starling.common.v1.message_pb2 import MessageProperties, Publisher, RoutedMessage
from starling.queue.v1 import queue_pb2
from tests.inproc import ADMIN_TOKEN, queue_service


@pytest.fixture(scope="module")
async def address(
    nats_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    data_dir = tmp_path_factory.mktemp("queue")
    async with queue_service(
        nats_url,
        redis_url,
        data_dir,
        "queue-client-test",
        max_queue_depth=3,
        depth_policy="reject_newest",
    ) as addr:
        yield addr


def envelope(topic: str, published_at_ms: int, expiry_s: int | None = None) -> RoutedMessage:
    props = MessageProperties(content_type="text/plain")
    if expiry_s is not None:
        props.message_expiry_interval_s = expiry_s
    return RoutedMessage(
        tenant="t",
        topic=topic,
        payload=topic.encode(),
        qos=2,
        publisher=Publisher(client_id="pub", node_id="n1"),
        published_at_ms=published_at_ms,
        message_id=f"{topic}-{uuid.uuid4().hex}",
        properties=props,
    )


async def test_append_read_release_ack_drop(address: str) -> None:
    client = QueueClient(address)
    admin = QueueAdminClient(address, ADMIN_TOKEN)
    qid = queue_id(f"c-{uuid.uuid4().hex[:6]}", 1)
    now_ms = int(time.time() * 1000)
    results = await client.append(
        "t",
        [
            NewEntry(qid, envelope("a", now_ms, 60), 1, True, (4, 7)),
            NewEntry(qid, envelope("gone", now_ms - 10_000, 1), 1, False),  # already expired
            NewEntry(qid, envelope("b", now_ms), 0, False),
            NewEntry(qid, envelope("c", now_ms), 1, False),  # over the depth limit of 3
        ],
    )
    assert results == [AppendResult.OK, AppendResult.OK, AppendResult.OK, AppendResult.QUEUE_FULL]

    read = await client.read("t", qid, 1, 10)
    assert isinstance(read, QueueRead)
    assert (read.acked_through, read.last_seq) == (0, 3)  # seq 2 examined, not returned
    first, second = read.entries
    assert isinstance(first, QueueEntry) and isinstance(first.message, Message)
    assert (first.seq, first.subscription_ids, first.released) == (1, (4, 7), False)
    m = first.message
    assert (m.tenant, m.topic, m.payload, m.publisher) == ("t", "a", b"a", "pub")
    assert (m.qos, m.retain) == (1, True)  # the entry's, not the publish's QoS 2
    assert m.expires_at == (now_ms + 60_000) / 1000
    assert m.properties.content_type == "text/plain"
    assert (second.seq, second.message.qos, second.message.expires_at) == (3, 0, None)
    assert second.subscription_ids == ()

    await client.mark_released("t", qid, [1])
    await client.ack("t", qid, 2)
    again = await client.read("t", qid, 1, 10)
    assert [e.seq for e in again.entries] == [3] and again.acked_through == 2
    assert await admin.queue_stats("t", qid) == QueueStats(
        depth=1, last_seq=3, acked_through=2, dropped=1
    )
    await client.mark_released("t", qid, [3])
    assert (await client.read("t", qid, 3, 10)).entries[0].released

    await client.drop("t", qid)
    assert (await client.read("t", qid, 1, 10)).entries == ()
    await client.close()
    await admin.close()


async def test_a_read_for_delivery_returns_the_delivered_mark_from_before_it(
    address: str,
) -> None:
    client = QueueClient(address)
    qid = queue_id(f"c-{uuid.uuid4().hex[:6]}", 1)
    now_ms = int(time.time() * 1000)
    await client.append("t", [NewEntry(qid, envelope(x, now_ms), 1, False) for x in "ab"])
    assert (await client.read("t", qid, 1, 10)).delivered_through == 0
    first = await client.read("t", qid, 1, 1, mark_delivered=True)  # a node sends seq 1
    assert [e.seq for e in first.entries] == [1] and first.delivered_through == 0
    again = await client.read("t", qid, 1, 10, mark_delivered=True)  # the next connection
    assert [e.seq for e in again.entries] == [1, 2] and again.delivered_through == 1
    assert (await client.read("t", qid, 1, 10)).delivered_through == 2
    await client.drop("t", qid)
    await client.close()


async def test_bad_requests_and_tokens_raise(address: str) -> None:
    client = QueueClient(address)
    with pytest.raises(InvalidArgumentError, match="tenant"):
        await client.append("", [NewEntry("q#1", envelope("a", 1), 1, False)])
    with pytest.raises(InvalidArgumentError, match="message_id"):
        await client.append("t", [NewEntry("q#1", RoutedMessage(topic="a"), 1, False)])
    admin = QueueAdminClient(address, "wrong")
    with pytest.raises(PermissionDeniedError):
        await admin.queue_stats("t", "q#1")
    await client.close()
    await admin.close()


def test_append_results_are_the_proto_values() -> None:
    assert {r.name: int(r) for r in AppendResult} == {
        queue_pb2.AppendResult.Name(v).removeprefix("APPEND_RESULT_"): v
        for v in queue_pb2.AppendResult.values()
        if v != queue_pb2.APPEND_RESULT_UNSPECIFIED
    }
