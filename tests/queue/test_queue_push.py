"""Entries pushed in queue notices to a caught-up reader (services/queue/readers.py), against
the queue service in this process (SQLite, a real nats-server): who gets them, and the DUP
mark every later reader sees."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from nats.aio.msg import Msg

from services.common.bus import subjects
from services.common.bus.client import connect
from services.common.bus.flushing import flushed
from services.queue.client import NewEntry, Notice, QueueClient, parse_notice
from services.queue.config import QueueSettings
from services.queue.main import QueueService
from starling.common.v1.message_pb2 import Publisher, RoutedMessage
from tests.inproc import queue_service, serving
from tests.poll import eventually

NOTICE_MAX_BYTES = 4096
TENANT = "t"


@pytest.fixture
async def address(
    nats_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    data_dir = tmp_path_factory.mktemp("queue")
    async with queue_service(
        nats_url, redis_url, data_dir, "queue-push-test", notice_max_bytes=NOTICE_MAX_BYTES
    ) as addr:
        yield addr


class Queue:
    """One queue, its client, and every notice published for it."""

    def __init__(self, address: str, nats_url: str) -> None:
        self.address, self.nats_url = address, nats_url
        self.qid = f"dev{uuid.uuid4().hex[:6]}#1"
        self.client = QueueClient(address)
        self.notices: list[Notice] = []

    async def __aenter__(self) -> Queue:
        self.nc = await connect(self.nats_url, "push-test")

        async def on_notice(m: Msg) -> None:
            self.notices.append(parse_notice(m.data))

        await self.nc.subscribe(subjects.queue_notice(TENANT, self.qid), cb=on_notice)
        await flushed(self.nc)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()
        await self.client.close()

    async def append(self, *topics: str, size: int = 8) -> Notice:
        """Append one message per topic; the notice it published."""
        seen = len(self.notices)
        entries = [
            NewEntry(
                self.qid,
                RoutedMessage(
                    tenant=TENANT,
                    topic=t,
                    payload=b"x" * size,
                    qos=1,
                    publisher=Publisher(client_id="pub", node_id="n1"),
                    message_id=f"{t}-{uuid.uuid4().hex}",
                ),
                1,
                False,
            )
            for t in topics
        ]
        await self.client.append(TENANT, entries)
        await eventually(lambda: len(self.notices) > seen, 5, "a notice", every_s=0.01)
        return self.notices[seen]

    async def delivered_mark(self) -> int:
        """The durable mark, as a read that delivers nothing (and so changes nothing) sees."""
        return (await self.client.read(TENANT, self.qid, 10**9, 1)).delivered_through


async def test_a_caught_up_reader_gets_new_entries_in_the_notice(
    address: str, nats_url: str
) -> None:
    async with Queue(address, nats_url) as q:
        n = await q.append("a1")
        assert n.entries() == ()  # nobody is reading yet: a plain notice
        r = await q.client.read(TENANT, q.qid, 1, 100, mark_delivered=True, reader="R")
        assert [e.seq for e in r.entries] == [1] and r.delivered_through == 0
        n = await q.append("a2", "a3")
        assert n.reader == "R" and n.last_seq == 3
        assert [(e.seq, e.message.topic, e.message.qos) for e in n.entries()] == [
            (2, "a2", 1),
            (3, "a3", 1),
        ]
        # Marked delivered by the append itself: another reader resends them with DUP=1.
        assert await q.delivered_mark() == 3
        other = await q.client.read(TENANT, q.qid, 1, 100, mark_delivered=True, reader="S")
        assert [e.seq for e in other.entries] == [1, 2, 3] and other.delivered_through == 3


async def test_pushed_entries_the_reader_did_not_send_are_read_back_as_first_attempts(
    address: str, nats_url: str
) -> None:
    """The reader skipped a push (its window was full): reading it back, the queue reports
    the mark from before its pushes, so the entry still goes out DUP=0."""
    async with Queue(address, nats_url) as q:
        await q.client.read(TENANT, q.qid, 1, 100, mark_delivered=True, reader="R")
        n = await q.append("b1")
        assert [e.seq for e in n.entries()] == [1]
        r = await q.client.read(TENANT, q.qid, 1, 100, mark_delivered=True, reader="R")
        assert [e.seq for e in r.entries] == [1] and r.delivered_through == 0
        # It is caught up again, so the next append is pushed to it again.
        assert [e.seq for e in (await q.append("b2")).entries()] == [2]


async def test_a_detached_reader_gets_no_pushes_and_offline_entries_stay_first_attempts(
    address: str, nats_url: str
) -> None:
    async with Queue(address, nats_url) as q:
        await q.client.read(TENANT, q.qid, 1, 100, mark_delivered=True, reader="R")
        await q.append("c1")  # pushed
        await q.client.ack(TENANT, q.qid, 1, detach_reader="R")  # the connection closed
        n = await q.append("c2")
        assert n.entries() == () and n.last_seq == 2
        assert await q.delivered_mark() == 1  # c2 was never handed out
        resumed = await q.client.read(TENANT, q.qid, 1, 100, mark_delivered=True, reader="R2")
        assert [e.seq for e in resumed.entries] == [2] and resumed.delivered_through == 1


async def test_a_reader_behind_or_a_large_append_gets_a_plain_notice(
    address: str, nats_url: str
) -> None:
    async with Queue(address, nats_url) as q:
        await q.append("d1", "d2", "d3")
        r = await q.client.read(TENANT, q.qid, 1, 2, mark_delivered=True, reader="R")
        assert [e.seq for e in r.entries] == [1, 2]  # not at the end
        assert (await q.append("d4")).entries() == ()
        r = await q.client.read(TENANT, q.qid, 3, 100, mark_delivered=True, reader="R")
        assert [e.seq for e in r.entries] == [3, 4] and r.delivered_through == 2
        big = await q.append("d5", size=NOTICE_MAX_BYTES + 1)
        assert big.entries() == () and await q.delivered_mark() == 4
        # After a gap the reader must read before anything is pushed again.
        assert (await q.append("d6")).entries() == ()
        await q.client.read(TENANT, q.qid, 5, 100, mark_delivered=True, reader="R")
        assert [e.seq for e in (await q.append("d7")).entries()] == [7]


async def test_after_a_queue_restart_pushed_entries_count_as_maybe_sent(
    nats_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The leases live in memory: after a restart the durable mark is all there is, and it
    covers what was pushed (DUP=1 errs the safe way)."""
    settings = QueueSettings(
        nats_url=nats_url,
        redis_url=redis_url,
        queue_lease_key_prefix=f"{uuid.uuid4().hex}:",  # partitions of its own
        data_dir=tmp_path_factory.mktemp("queue"),
        metrics_port=-1,
        node_id="queue-push-restart",
    )
    async with serving(QueueService(settings)) as addr, Queue(addr, nats_url) as q:
        await q.client.read(TENANT, q.qid, 1, 100, mark_delivered=True, reader="R")
        assert [e.seq for e in (await q.append("e1", "e2")).entries()] == [1, 2]
        qid = q.qid
    async with serving(QueueService(settings)) as addr:
        client = QueueClient(addr)
        r = await client.read(TENANT, qid, 1, 100, mark_delivered=True, reader="R")
        assert [e.seq for e in r.entries] == [1, 2] and r.delivered_through == 2
        await client.close()


async def test_pushes_stop_at_the_room_the_reader_said_it_had(address: str, nats_url: str) -> None:
    """A reader whose connection can take 3 more gets at most 3 pushed: what its node could
    not send, were it to die, would come back DUP=1, so no more than that is marked."""
    async with Queue(address, nats_url) as q:
        await q.client.read(TENANT, q.qid, 1, 3, mark_delivered=True, reader="R")
        assert [e.seq for e in (await q.append("f1", "f2")).entries()] == [1, 2]
        assert (await q.append("f3", "f4")).entries() == ()  # one left: not pushed
        assert await q.delivered_mark() == 2
        assert (await q.append("f5")).entries() == ()  # a gap to read first
        r = await q.client.read(TENANT, q.qid, 3, 10, mark_delivered=True, reader="R")
        assert [e.seq for e in r.entries] == [3, 4, 5] and r.delivered_through == 0
        assert [e.seq for e in (await q.append("f6")).entries()] == [6]  # room renewed


async def test_an_ack_renews_the_room_of_a_caught_up_reader(address: str, nats_url: str) -> None:
    """A steady stream used to run the credit out every read's worth of entries, and the
    next message then waited for a Read: the node's acks renew it instead, counting what was
    pushed beyond what the reader had received when it said how much room it had."""
    async with Queue(address, nats_url) as q:
        await q.client.read(TENANT, q.qid, 1, 3, mark_delivered=True, reader="R")
        assert [e.seq for e in (await q.append("g1", "g2", "g3")).entries()] == [1, 2, 3]
        # Received through 2 when it acked (3 was still on its way), room for 4 more: 3 is
        # one of those 4, so 3 more may be pushed, not 4.
        await q.client.ack(TENANT, q.qid, 2, renew=("R", 4, 2))
        assert [e.seq for e in (await q.append("g4", "g5", "g6")).entries()] == [4, 5, 6]
        assert await q.delivered_mark() == 6
        assert (await q.append("g7")).entries() == ()  # past the renewed credit
        r = await q.client.read(TENANT, q.qid, 7, 10, mark_delivered=True, reader="R")
        assert [e.seq for e in r.entries] == [7]
        # Another reader's renewal changes nothing for R's lease, nor gives S one.
        await q.client.ack(TENANT, q.qid, 7, renew=("R", 1, 7))
        await q.client.ack(TENANT, q.qid, 7, renew=("S", 50, 7))
        assert [e.seq for e in (await q.append("g8")).entries()] == [8]
        assert (await q.append("g9")).entries() == ()


async def test_an_ack_does_not_renew_a_reader_with_a_gap_to_read(
    address: str, nats_url: str
) -> None:
    async with Queue(address, nats_url) as q:
        await q.client.read(TENANT, q.qid, 1, 1, mark_delivered=True, reader="R")
        assert (await q.append("h1", "h2")).entries() == ()  # more than its room: a gap
        await q.client.ack(TENANT, q.qid, 0, renew=("R", 100, 0))
        assert (await q.append("h3")).entries() == ()  # it must read 1..2 first
