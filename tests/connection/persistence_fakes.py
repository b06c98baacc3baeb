"""The queue and NATS fakes a persistent delivery is tested against without a queue service
(tests/connection/test_persistence*.py, test_sweeper.py), and the steps those tests share:
build a delivery, let it run, read what it wrote, answer as the client."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from services.common.message import Message
from services.common.mqtt import PubAck, Publish, PubRec, encode
from services.connection.persistence import DeliveryDeps, PersistentDelivery, pid_for
from services.queue.client import QueueEntry, QueueRead
from starling.common.v1.message_pb2 import RoutedMessage
from starling.queue.v1 import queue_pb2 as pb
from tests.connection.harness import connected, written


class FakeQueue:
    """The queue service's read contract: acked entries are gone, and a read with
    `mark_delivered` raises delivered_through and returns the value from before it."""

    def __init__(self, entries: list[QueueEntry], delivered_through: int = 0) -> None:
        self.entries = entries
        self.acked_through = 0
        self.delivered_through = delivered_through
        self.released: list[int] = []
        self.unmarked_reads = 0
        self.reads = 0

    async def read(
        self,
        tenant: str,
        queue_id: str,
        from_seq: int,
        limit: int,
        mark_delivered: bool = False,
        reader: str = "",  # pushes are tested against the real queue (tests/queue)
    ) -> QueueRead:
        self.reads += 1
        unacked = [e for e in self.entries if e.seq >= from_seq and e.seq > self.acked_through]
        found = tuple(unacked[:limit])
        last = found[-1].seq if found else from_seq - 1
        before = self.delivered_through
        if not mark_delivered:
            self.unmarked_reads += 1
        elif found:
            self.delivered_through = max(before, found[-1].seq)
        return QueueRead(found, self.acked_through, last, before)

    async def ack(
        self,
        tenant: str,
        queue_id: str,
        through_seq: int,
        detach_reader: str = "",
        renew: tuple[str, int, int] | None = None,  # push credit: tested in test_push_credit
    ) -> None:
        self.acked_through = max(self.acked_through, through_seq)

    def listen(self, reader: str, on_notice: object) -> None:  # link notices: tests/queue
        pass

    def unlisten(self, reader: str) -> None:
        pass

    generation = 0  # no queue link, no owners: no notice gets lost

    async def mark_released(self, tenant: str, queue_id: str, seqs: Sequence[int]) -> None:
        self.released += seqs


class FakeNats:
    async def subscribe(self, subject: str, cb: object) -> object:
        return None


def _entry(seq: int, qos: int = 1, released: bool = False) -> QueueEntry:
    return QueueEntry(seq, Message("t", "a/b", f"m{seq}".encode(), qos, False), (), released)


def _pubacks(ch: object, pd: PersistentDelivery, *seqs: int) -> None:
    """The client acknowledges these entries, one PUBACK each, in this order."""
    for seq in seqs:
        ch.receive(encode(PubAck(pid_for(seq)), 5), 0.0)  # type: ignore[attr-defined]
        pd.progress()


async def _pubrecs(ch: object, pd: PersistentDelivery, *seqs: int) -> None:
    """The client answers these QoS 2 entries with PUBREC, all in one read of the socket."""
    data = b"".join(encode(PubRec(pid_for(s)), 5) for s in seqs)
    ch.receive(data, 0.0)  # type: ignore[attr-defined]
    pd.progress()
    await _settle()


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def _delivery(
    queue: FakeQueue, wakes: list[float] | None = None
) -> tuple[PersistentDelivery, object, object]:
    """`wakes`: the times the delivery asks the sweeper to call `poll_if_due` at."""
    ch, dec = connected(5)
    wake = wakes.append if wakes is not None else lambda at: None
    deps = DeliveryDeps(queue=queue, nc=FakeNats(), now=lambda: 0.0)  # type: ignore[arg-type]
    pd = PersistentDelivery(
        channel=ch, deps=deps, tenant="t", queue_id="q", wrote=lambda: None, wake=wake
    )
    return pd, ch, dec


def _publishes(ch: object, dec: object) -> list[tuple[int | None, bool, bytes]]:
    got = written(ch, dec)  # type: ignore[arg-type]
    return [(p.packet_id, p.dup, p.payload) for p in got if isinstance(p, Publish)]


class _Msg:
    def __init__(self, data: bytes) -> None:
        self.data = data


def _notice(reader: str, seqs: list[int], last_seq: int) -> _Msg:
    """A queue notice as NATS hands it over: these seqs pushed to `reader`."""
    n = pb.QueueNotice(tenant="t", queue_id="q", last_seq=last_seq, reader=reader)
    for s in seqs:
        m = RoutedMessage(tenant="t", topic="a/b", payload=f"m{s}".encode(), qos=1)
        n.entries.add(seq=s, message=m, qos=1)
    return _Msg(n.SerializeToString())
