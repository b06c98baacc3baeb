"""A persistent session's queue delivered to its channel: packet ids from seqs, DUP only on
entries an earlier read may have sent, acks only through what the client completed, pushed
entries, the push credit and the idle poll. QoS 2 release state: test_persistence_qos2.py."""

from __future__ import annotations

import asyncio

from services.common.mqtt import PubAck, Publish, encode
from services.connection.channel import DeliveryProgress
from services.connection.persistence import READ_BATCH, pid_for
from services.connection.queue_poll import POLL_MAX_S
from services.queue.client import QueueRead
from tests.connection.harness import written
from tests.connection.persistence_fakes import (
    FakeQueue,
    _delivery,
    _entry,
    _notice,
    _pubacks,
    _publishes,
    _settle,
)
from tests.poll import eventually, holds_within_async


async def test_backlog_never_sent_before_goes_out_with_dup_0_under_seq_packet_ids() -> None:
    # Queued while the session was offline: no connection ever had these entries.
    queue = FakeQueue([_entry(1), _entry(2)])
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    assert _publishes(ch, dec) == [(pid_for(1), False, b"m1"), (pid_for(2), False, b"m2")]
    assert queue.unmarked_reads == 0 and queue.delivered_through == 2
    await pd.close()


async def test_only_entries_at_or_below_the_delivered_mark_are_resent_with_dup() -> None:
    # An earlier connection was handed 1..2 (maybe sent); 3 arrived after it went away.
    queue = FakeQueue([_entry(1), _entry(2), _entry(3)], delivered_through=2)
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    assert _publishes(ch, dec) == [
        (pid_for(1), True, b"m1"),
        (pid_for(2), True, b"m2"),
        (pid_for(3), False, b"m3"),
    ]
    await pd.close()


async def test_unacked_entries_of_a_dead_connection_are_dup_on_the_next_one() -> None:
    queue = FakeQueue([_entry(1), _entry(2)])
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    assert [dup for _, dup, _ in _publishes(ch, dec)] == [False, False]
    _pubacks(ch, pd, 1)
    await pd.close()  # connection lost with 2 unacknowledged
    queue.entries.append(_entry(3))  # queued while offline
    pd2, ch2, dec2 = _delivery(queue)
    await pd2.start()
    await _settle()
    assert _publishes(ch2, dec2) == [(pid_for(2), True, b"m2"), (pid_for(3), False, b"m3")]
    # Within one connection, later reads are first attempts again.
    queue.entries.append(_entry(4))
    pd2.poll()
    await _settle()
    assert _publishes(ch2, dec2) == [(pid_for(4), False, b"m4")]
    await pd2.close()


async def test_the_queue_is_acked_only_through_what_the_client_completed() -> None:
    queue = FakeQueue([_entry(1), _entry(2), _entry(3)])
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    assert [p.dup for p in written(ch, dec) if isinstance(p, Publish)] == [False] * 3  # type: ignore[arg-type]
    # PUBACK for 1 and 3, not 2: the queue may only forget seq 1.
    for seq in (1, 3):
        actions = ch.receive(encode(PubAck(pid_for(seq)), 5), 0.0)  # type: ignore[attr-defined]
        assert DeliveryProgress() in actions
        pd.progress()
    await eventually(
        lambda: queue.acked_through == 1, 5, lambda: f"acked through {queue.acked_through}"
    )
    _pubacks(ch, pd, 2)
    await eventually(
        lambda: queue.acked_through == 3, 5, lambda: f"acked through {queue.acked_through}"
    )
    await pd.close()


async def test_a_connection_closed_during_a_read_sends_and_acks_nothing() -> None:
    queue = FakeQueue([_entry(1), _entry(2)])
    gate = asyncio.Event()
    read = queue.read

    async def slow_read(*args: object, **kwargs: object) -> QueueRead:
        await gate.wait()
        return await read(*args, **kwargs)  # type: ignore[arg-type]

    queue.read = slow_read  # type: ignore[method-assign]
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    await pd.close()  # the client left while the read was under way
    gate.set()
    await _settle()
    assert _publishes(ch, dec) == []
    assert queue.acked_through == 0  # the entries stay for the next connection


async def test_an_entry_whose_packet_id_is_in_flight_waits_and_is_never_lost() -> None:
    # seq 1 and seq 65536 share packet id 2. The old code skipped 65536 while 1 was in flight,
    # and the ack after 1 and 65537 completed passed it: lost.
    queue = FakeQueue([_entry(1), _entry(65536), _entry(65537)])
    assert pid_for(1) == pid_for(65536)
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    assert _publishes(ch, dec) == [(pid_for(1), False, b"m1")]  # the rest waits for id 2
    _pubacks(ch, pd, 1)
    await _settle()
    # Marked delivered by the earlier read, but that read was this connection's and did not
    # send them: still first attempts.
    assert _publishes(ch, dec) == [
        (pid_for(65536), False, b"m65536"),
        (pid_for(65537), False, b"m65537"),
    ]
    # Never past the entries still unacknowledged.
    await eventually(
        lambda: queue.acked_through == 65535, 5, lambda: f"acked through {queue.acked_through}"
    )
    _pubacks(ch, pd, 65537, 65536)
    await eventually(
        lambda: queue.acked_through == 65537, 5, lambda: f"acked through {queue.acked_through}"
    )
    await pd.close()


async def test_an_entry_read_again_by_its_connection_keeps_the_mark_of_its_first_read() -> None:
    # An earlier connection was handed seq 1 (maybe sent). This connection's first read takes
    # 1, 65536 and 65537 and marks them delivered, but 65536 waits for packet id 2 (seq 1's):
    # read again, 65536 and 65537 are above the mark of the first read, so DUP=0, whatever the
    # queue's mark (now 65537) says. (The e2e case: a budget that holds entries back.)
    queue = FakeQueue([_entry(1), _entry(65536), _entry(65537)], delivered_through=1)
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    assert _publishes(ch, dec) == [(pid_for(1), True, b"m1")]
    assert queue.delivered_through == 65537
    _pubacks(ch, pd, 1)
    await _settle()
    assert _publishes(ch, dec) == [
        (pid_for(65536), False, b"m65536"),
        (pid_for(65537), False, b"m65537"),
    ]
    await pd.close()


async def test_a_queued_entry_never_takes_the_packet_id_of_a_shared_delivery() -> None:
    queue = FakeQueue([_entry(1), _entry(2)])
    pd, ch, dec = _delivery(queue)
    ch.outbound.track_completions()  # type: ignore[attr-defined]
    # A shared-subscription delivery (not from the queue) holds packet id 3 = pid_for(2).
    ch.outbound.inflight[pid_for(2)] = 1  # type: ignore[attr-defined]
    await pd.start()
    await _settle()
    assert [pid for pid, _, _ in _publishes(ch, dec)] == [pid_for(1)]
    # Entry 2 was not sent, 1 is not acknowledged: nothing may be acked.
    assert not await holds_within_async(lambda: queue.acked_through != 0, 0.1)
    _pubacks(ch, pd, 1, 2)  # 2: the shared one
    await _settle()
    assert [(pid, payload) for pid, _, payload in _publishes(ch, dec)] == [(pid_for(2), b"m2")]
    await pd.close()


async def test_pushed_entries_go_out_dup_0_without_a_read_only_where_they_fit() -> None:
    queue = FakeQueue([_entry(1)])
    reads = 0
    real_read = queue.read

    async def counting_read(*args: object, **kwargs: object) -> QueueRead:
        nonlocal reads
        reads += 1
        return await real_read(*args, **kwargs)  # type: ignore[arg-type]

    queue.read = counting_read  # type: ignore[method-assign]
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    assert _publishes(ch, dec) == [(pid_for(1), False, b"m1")]
    before = reads
    await pd._on_notice(_notice(pd.reader, [2, 3], 3))  # type: ignore[arg-type]
    await _settle()
    assert _publishes(ch, dec) == [(pid_for(2), False, b"m2"), (pid_for(3), False, b"m3")]
    assert reads == before  # sent straight from the notice
    # Pushed to another reader (another connection of the session): not sent from here.
    await pd._on_notice(_notice("someone-else", [4], 4))  # type: ignore[arg-type]
    await _settle()
    assert _publishes(ch, dec) == [] and reads > before  # this one reads instead
    # A gap (seq 5 missing here): read back, never sent out of order.
    before = reads
    await pd._on_notice(_notice(pd.reader, [6], 6))  # type: ignore[arg-type]
    await _settle()
    assert _publishes(ch, dec) == [] and reads > before


async def test_entries_pushed_during_a_read_go_out_after_it_once_in_order_dup_0() -> None:
    queue = FakeQueue([_entry(1), _entry(2)])
    reads = 0
    gate = asyncio.Event()
    real_read = queue.read

    async def held_read(*args: object, **kwargs: object) -> QueueRead:
        nonlocal reads
        reads += 1
        out = await real_read(*args, **kwargs)  # type: ignore[arg-type]
        if reads == 1:
            await gate.wait()  # the answer is on its way while 3 and 4 are appended
        return out

    queue.read = held_read  # type: ignore[method-assign]
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    queue.entries += [_entry(3), _entry(4)]
    # Pushed to this reader while its read is under way; 2 came in the read as well.
    await pd._on_notice(_notice(pd.reader, [2, 3, 4], 4))  # type: ignore[arg-type]
    assert _publishes(ch, dec) == []
    gate.set()
    await _settle()
    assert _publishes(ch, dec) == [(pid_for(s), False, f"m{s}".encode()) for s in (1, 2, 3, 4)]
    # One more read finds the end; 3 and 4 were not read back.
    assert reads == 2 and not pd.more
    await pd.close()


async def test_a_pump_before_start_reads_nothing_and_every_ack_still_reaches_the_queue() -> None:
    # A drained transport (Conn.writable) or the sweeper's poll can call pump() while start()
    # still waits behind other ordered operations. It once read and sent entries then, while
    # the channel did not yet report completions: the client's PUBACKs were dropped, the
    # queue was never acked, and every later connection got the same messages again.
    queue = FakeQueue([_entry(1), _entry(2)])
    pd, ch, dec = _delivery(queue)
    pd.pump()
    await _settle()
    assert _publishes(ch, dec) == [] and queue.delivered_through == 0
    await pd.start()
    await _settle()
    assert [pid for pid, _, _ in _publishes(ch, dec)] == [pid_for(1), pid_for(2)]
    for seq in (1, 2):
        actions = ch.receive(encode(PubAck(pid_for(seq)), 5), 0.0)  # type: ignore[attr-defined]
        assert any(isinstance(a, DeliveryProgress) for a in actions)
    pd.progress()
    await pd.close()
    assert queue.acked_through == 2


async def test_acks_renew_the_push_credit_only_while_no_read_is_under_way_or_due() -> None:
    """The queue's pushes to this delivery are bounded by the room its acks report
    (services/queue/readers.py): only a caught-up delivery reports it, with the highest seq
    it received, so pushes on their way are counted against it."""
    queue = FakeQueue([_entry(1), _entry(2)])
    renewals: list[tuple[int, tuple[str, int, int] | None]] = []
    real_ack = queue.ack

    async def recording_ack(
        tenant: str,
        queue_id: str,
        through_seq: int,
        detach_reader: str = "",
        renew: tuple[str, int, int] | None = None,
    ) -> None:
        renewals.append((through_seq, renew))
        await real_ack(tenant, queue_id, through_seq, detach_reader)

    queue.ack = recording_ack  # type: ignore[method-assign]
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    assert [p[0] for p in _publishes(ch, dec)] == [pid_for(1), pid_for(2)]
    _pubacks(ch, pd, 1, 2)
    await eventually(lambda: renewals, 5, "a renewal", every_s=0.005)
    assert renewals == [(2, (pd.reader, READ_BATCH, 2))]  # the window takes a read's worth
    # Due or under way, a read sets the credit itself: no renewal then.
    pd.more = True
    assert pd._room() is None
    pd.more = False
    pd._reading = True
    assert pd._room() is None
    pd._reading = False
    pd._blocked_on = pid_for(3)
    assert pd._room() is None
    pd._blocked_on = 0
    assert pd._room() == (pd.reader, READ_BATCH, 2)
    await pd.close()


async def test_an_idle_session_polls_its_queue_ever_less_often_and_at_once_after_a_change() -> None:
    """`poll_if_due` called every second (the sweeper calls it less often: at `next_poll`,
    tests/connection/test_sweeper.py). Idle, a session reads its queue ever less often (a
    read per second per idle session was a quarter of the queue service's core at 5,000
    sessions); an entry whose notice was lost is still found, within the longest interval;
    after it, polls are frequent again; and when notices may have been lost (the queue
    client's generation moved) the next poll reads at once."""
    queue = FakeQueue([])
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    start = queue.reads
    pd.poll_if_due(0.5)  # the start's read was the first poll: no second read at once
    await _settle()
    assert queue.reads == start
    t = 0.0
    for _ in range(60):  # a minute of sweeps with nothing queued
        t += 1.0
        pd.poll_if_due(t)
        await _settle()
    # 1, 2, 4, 8, 16, 16, ... seconds apart (each within 20%): the old poll read 60 times.
    assert 5 <= queue.reads - start <= 8
    queue.entries.append(_entry(1))  # its notice never came
    found_after = 0
    while not _publishes(ch, dec):
        t += 1.0
        found_after += 1
        assert found_after <= POLL_MAX_S * 1.2 + 1, "a lost notice's entry was never read"
        pd.poll_if_due(t)
        await _settle()
    _pubacks(ch, pd, 1)
    queue.entries.append(_entry(2))  # lost notice again, right after activity
    t += 1.3  # the interval is back at POLL_MIN_S (+20% jitter)
    pd.poll_if_due(t)
    await _settle()
    assert _publishes(ch, dec) == [(pid_for(2), False, b"m2")]
    _pubacks(ch, pd, 2)
    for _ in range(40):  # idle again: back to long intervals
        t += 1.0
        pd.poll_if_due(t)
        await _settle()
    queue.entries.append(_entry(3))
    queue.generation += 1  # e.g. the queue link broke: notices may be lost
    pd.poll_if_due(t + 0.01)
    await _settle()
    assert _publishes(ch, dec) == [(pid_for(3), False, b"m3")]
    await pd.close()
