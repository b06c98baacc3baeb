"""A persistent session's delivery against the real queue service (SQLite, a real
nats-server): at a steady rate its entries come pushed in the queue's notices, with no Read
per batch of them, because its acks renew its push credit (services/queue/readers.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from services.common.bus.client import connect
from services.common.mqtt import PubAck, Publish, encode
from services.connection.persistence import READ_BATCH, DeliveryDeps, PersistentDelivery, pid_for
from services.queue.client import NewEntry, QueueClient, QueueRead
from starling.common.v1.message_pb2 import Publisher, RoutedMessage
from tests.connection.harness import connected, written
from tests.inproc import queue_service
from tests.poll import eventually

TENANT = "t"


@pytest.fixture
async def address(
    nats_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    data_dir = tmp_path_factory.mktemp("queue")
    async with queue_service(nats_url, redis_url, data_dir, "push-credit-test") as addr:
        yield addr


def _message(i: int) -> RoutedMessage:
    return RoutedMessage(
        tenant=TENANT,
        topic="a/b",
        payload=f"m{i}".encode(),
        qos=1,
        publisher=Publisher(client_id="pub", node_id="n1"),
        message_id=f"m{i}-{uuid.uuid4().hex}",
    )


class CountingQueue(QueueClient):
    """The real queue client, counting its Reads."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.reads = 0

    async def read(self, *args: object, **kwargs: object) -> QueueRead:  # type: ignore[override]
        self.reads += 1
        return await super().read(*args, **kwargs)  # type: ignore[arg-type]


async def test_a_steady_stream_is_pushed_without_a_read_per_batch(
    address: str, nats_url: str
) -> None:
    """Three read batches' worth of messages, one at a time, each acknowledged by the client
    as it arrives: every one is delivered in order, DUP=0, and the delivery reads its queue
    only at the start. Before, the credit a Read gave ran out after READ_BATCH pushes and
    the next message waited for a Read (at 1,000 msg/s: a latency spike every ~100 ms)."""
    qid = f"dev{uuid.uuid4().hex[:6]}#1"
    client = CountingQueue(address)
    nc = await connect(nats_url, "push-credit")
    ch, dec = connected(4)  # MQTT 3.1.1: a window of 256
    pd = PersistentDelivery(
        channel=ch,
        deps=DeliveryDeps(queue=client, nc=nc, now=lambda: 0.0),
        tenant=TENANT,
        queue_id=qid,
        wrote=lambda: None,
        wake=lambda at: None,
    )
    got: list[Publish] = []
    try:
        await pd.start()
        count = 3 * READ_BATCH + 20
        warm = 0
        for i in range(1, count + 1):
            if i == 10:  # the reads that started the delivery (and took its first notices)
                warm = client.reads
            await client.append(TENANT, [NewEntry(qid, _message(i), 1, False)])

            def delivered(i: int = i) -> bool:
                got.extend(p for p in written(ch, dec) if isinstance(p, Publish))
                return len(got) >= i

            await eventually(delivered, 5, f"message {i} delivered", every_s=0.002)
            assert len(got) == i, f"message {i} delivered more than once"
            ch.receive(encode(PubAck(pid_for(i)), 4), 0.0)
            pd.progress()
        assert [p.payload for p in got] == [f"m{i}".encode() for i in range(1, count + 1)]
        assert not any(p.dup for p in got)
        # Not one per batch: at most one where an ack raced a notice.
        reads = client.reads - warm
        assert reads <= 1, f"{reads} reads for {count - 9} messages"
    finally:
        await pd.close()
        await nc.close()
        await client.close()
