"""QoS 2 out of a persistent session's queue: a PUBREC is recorded in the queue as a
released mark before PUBREL goes out, PUBRELs keep PUBREC order, failed marks are retried,
and a released entry gets PUBREL, not PUBLISH, on the next connection."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from services.common.mqtt import PubComp, PubRec, PubRel, encode
from services.connection.persistence import pid_for
from tests.connection.harness import written
from tests.connection.persistence_fakes import FakeQueue, _delivery, _entry, _pubrecs, _settle
from tests.poll import eventually


async def test_qos2_pubrec_is_recorded_and_a_released_entry_gets_pubrel_not_publish() -> None:
    queue = FakeQueue([_entry(1, qos=2)])
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    written(ch, dec)  # type: ignore[arg-type]
    ch.receive(encode(PubRec(pid_for(1)), 5), 0.0)  # type: ignore[attr-defined]
    pd.progress()
    await _settle()
    assert queue.released == [1]
    assert [type(p) for p in written(ch, dec)] == [PubRel]  # type: ignore[arg-type]
    await pd.close()
    # The next connection finds the entry released: it resends PUBREL, then completes.
    queue.entries = [_entry(1, qos=2, released=True)]
    pd2, ch2, dec2 = _delivery(queue)
    await pd2.start()
    await _settle()
    assert [type(p) for p in written(ch2, dec2)] == [PubRel]  # type: ignore[arg-type]
    ch2.receive(encode(PubComp(pid_for(1)), 5), 0.0)  # type: ignore[attr-defined]
    pd2.progress()
    await eventually(
        lambda: queue.acked_through == 1, 5, lambda: f"acked through {queue.acked_through}"
    )
    await pd2.close()


async def test_pubrel_waits_until_the_released_mark_is_durable() -> None:
    # A client that got PUBREL forgets the message: if the mark were lost after that, the
    # next connection would resend the PUBLISH and the client would deliver it twice.
    queue = FakeQueue([_entry(1, qos=2)])
    durable = asyncio.Event()
    mark = queue.mark_released

    async def slow_mark(tenant: str, queue_id: str, seqs: Sequence[int]) -> None:
        await durable.wait()
        await mark(tenant, queue_id, seqs)

    queue.mark_released = slow_mark  # type: ignore[method-assign]
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    written(ch, dec)  # type: ignore[arg-type]
    ch.receive(encode(PubRec(pid_for(1)), 5) * 2, 0.0)  # type: ignore[attr-defined]
    pd.progress()
    await _settle()
    assert written(ch, dec) == []  # type: ignore[arg-type]  # no PUBREL, no 0x92 for the repeat
    durable.set()
    await _settle()
    assert queue.released == [1]
    assert written(ch, dec) == [PubRel(pid_for(1))]  # type: ignore[arg-type]
    await pd.close()


async def test_a_failed_released_mark_is_retried_before_pubrel() -> None:
    queue = FakeQueue([_entry(1, qos=2)])
    mark = queue.mark_released
    failures = [RuntimeError("queue down")]

    async def flaky_mark(tenant: str, queue_id: str, seqs: Sequence[int]) -> None:
        if failures:
            raise failures.pop()
        await mark(tenant, queue_id, seqs)

    queue.mark_released = flaky_mark  # type: ignore[method-assign]
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    written(ch, dec)  # type: ignore[arg-type]
    ch.receive(encode(PubRec(pid_for(1)), 5), 0.0)  # type: ignore[attr-defined]
    pd.progress()
    await _settle()
    assert written(ch, dec) == []  # type: ignore[arg-type]
    # The retry comes after a short pause.
    await eventually(lambda: queue.released, 5, "the retried release")
    await _settle()
    assert queue.released == [1]
    assert written(ch, dec) == [PubRel(pid_for(1))]  # type: ignore[arg-type]
    await pd.close()


async def test_pubrels_keep_pubrec_order_when_the_marks_finish_out_of_order() -> None:
    # [MQTT-4.6.0-3]: the subscriber hands a QoS 2 message to its application on PUBREL, so a
    # PUBREL that overtakes an earlier one delivers the publisher's messages out of order.
    queue = FakeQueue([_entry(1, qos=2), _entry(2, qos=2)])
    first_durable = asyncio.Event()
    mark = queue.mark_released

    async def first_slow(tenant: str, queue_id: str, seqs: Sequence[int]) -> None:
        if 1 in seqs:
            await first_durable.wait()
        await mark(tenant, queue_id, seqs)

    queue.mark_released = first_slow  # type: ignore[method-assign]
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    written(ch, dec)  # type: ignore[arg-type]  # the PUBLISHes
    await _pubrecs(ch, pd, 1)
    await _pubrecs(ch, pd, 2)  # its mark is durable first
    assert written(ch, dec) == []  # type: ignore[arg-type]  # PUBREL 2 waits behind PUBREL 1
    first_durable.set()
    await _settle()
    assert written(ch, dec) == [PubRel(pid_for(1)), PubRel(pid_for(2))]  # type: ignore[arg-type]
    await pd.close()


async def test_a_failed_mark_holds_back_the_pubrels_behind_it() -> None:
    queue = FakeQueue([_entry(1, qos=2), _entry(2, qos=2), _entry(3, qos=2)])
    mark = queue.mark_released
    failures = [RuntimeError("queue busy")]

    async def first_fails_once(tenant: str, queue_id: str, seqs: Sequence[int]) -> None:
        if 1 in seqs and failures:
            raise failures.pop()
        await mark(tenant, queue_id, seqs)

    queue.mark_released = first_fails_once  # type: ignore[method-assign]
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    written(ch, dec)  # type: ignore[arg-type]  # the PUBLISHes
    await _pubrecs(ch, pd, 1, 2)
    await _pubrecs(ch, pd, 3)
    assert written(ch, dec) == []  # type: ignore[arg-type]
    # The retry comes after a short pause.
    await eventually(lambda: 1 in queue.released, 5, "the retried release")
    await _settle()
    assert written(ch, dec) == [PubRel(pid_for(s)) for s in (1, 2, 3)]  # type: ignore[arg-type]
    assert sorted(queue.released) == [1, 2, 3]  # each marked once
    await pd.close()


async def test_pubrecs_that_come_during_a_mark_are_marked_in_one_call() -> None:
    """One queue call per batch of PUBRECs, not one per message (QoS 2 out is not a call
    per message)."""
    queue = FakeQueue([_entry(s, qos=2) for s in (1, 2, 3, 4)])
    calls: list[list[int]] = []
    first_durable = asyncio.Event()
    mark = queue.mark_released

    async def recorded(tenant: str, queue_id: str, seqs: Sequence[int]) -> None:
        calls.append(list(seqs))
        if 1 in seqs:
            await first_durable.wait()
        await mark(tenant, queue_id, seqs)

    queue.mark_released = recorded  # type: ignore[method-assign]
    pd, ch, dec = _delivery(queue)
    await pd.start()
    await _settle()
    written(ch, dec)  # type: ignore[arg-type]  # the PUBLISHes
    await _pubrecs(ch, pd, 1)
    await _pubrecs(ch, pd, 2)
    await _pubrecs(ch, pd, 3, 4)
    first_durable.set()
    await _settle()
    assert calls == [[1], [2, 3, 4]]
    assert written(ch, dec) == [PubRel(pid_for(s)) for s in (1, 2, 3, 4)]  # type: ignore[arg-type]
    await pd.close()
