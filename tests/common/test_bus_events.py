"""EVENTS messages: an event alone or a batch, and the batcher that sends the events of one
loop turn together (real NATS server)."""

from __future__ import annotations

import uuid

import nats
from nats.aio.msg import Msg

from services.common.bus.events import MAX_BATCH, EventBatcher, decode_events, encode_events
from services.common.bus.flushing import flushed
from starling.common.v1 import event_pb2
from tests.poll import holds_within_async


def _ev(client: str) -> event_pb2.Event:
    return event_pb2.Event(tenant="t", client_id=client, type=event_pb2.EVENT_TYPE_CLIENT_CONNECTED)


def test_one_event_is_sent_as_an_event_that_readers_before_batches_understand() -> None:
    data = encode_events([_ev("a")])
    assert event_pb2.Event.FromString(data) == _ev("a")
    assert decode_events(data) == [_ev("a")]


def test_a_batch_reads_back_in_order_and_as_no_event_to_an_old_reader() -> None:
    data = encode_events([_ev("a"), _ev("b"), _ev("c")])
    assert [e.client_id for e in decode_events(data)] == ["a", "b", "c"]
    # A reader that takes every message for one Event sees one without a tenant (skipped),
    # never another client's event.
    assert event_pb2.Event.FromString(data).tenant == ""


def test_bytes_that_are_no_event_give_none() -> None:
    assert decode_events(b"\xff\xff") == []


async def test_the_events_of_one_loop_turn_go_in_one_message_per_subject(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    got: list[Msg] = []
    prefix = f"evtest.{uuid.uuid4().hex[:8]}"

    async def on(msg: Msg) -> None:
        got.append(msg)

    await nc.subscribe(f"{prefix}.>", cb=on)
    batcher = EventBatcher(nc)
    try:
        for i in range(MAX_BATCH + 10):  # one turn: one full message and a second one
            batcher.emit(f"{prefix}.connected", _ev(f"c{i}"))
        batcher.emit(f"{prefix}.disconnected", _ev("x"))

        async def arrived(n: int) -> None:
            async def enough() -> bool:
                await flushed(nc)
                return len(got) >= n

            await holds_within_async(enough, 2)  # settling: the asserts below count them

        await arrived(3)
        batcher.emit(f"{prefix}.connected", _ev("late"))  # a later turn: a message of its own
        await arrived(4)
        by_subject: dict[str, list[str]] = {}
        sizes = []
        for m in got:
            events = decode_events(m.data)
            sizes.append(len(events))
            by_subject.setdefault(m.subject, []).extend(e.client_id for e in events)
        assert sorted(sizes) == [1, 1, 10, MAX_BATCH]
        assert by_subject[f"{prefix}.connected"] == [
            *(f"c{i}" for i in range(MAX_BATCH + 10)),
            "late",
        ]
        assert by_subject[f"{prefix}.disconnected"] == ["x"]
    finally:
        await nc.close()
