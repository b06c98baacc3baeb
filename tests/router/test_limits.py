"""The router's per-tenant caps on retained and pending `$delayed` messages: a publish past a
cap gets QUOTA_EXCEEDED (the node answers 0x97) and is counted, deleting or shrinking always
works, other tenants are untouched, and the usage survives a restart (read back from the
store). The router's parts of tests/router/conftest.py (real SQLite, queue service, NATS)."""

from __future__ import annotations

import asyncio
import time
import uuid

from services.common.route_table import RouteResult
from services.router.limits import Caps, Usage, fits
from services.router.retained import Retained, RetainedIndex
from starling.common.v1.message_pb2 import MessageProperties, RoutedMessage
from starling.common.v1.message_pb2 import Publisher as Origin
from tests.poll import eventually
from tests.router.conftest import RouterFactory

OK, FULL = RouteResult.STORED, RouteResult.QUOTA_EXCEEDED
NO_MATCH = RouteResult.NO_MATCH


def tenant() -> str:
    return f"lim{uuid.uuid4().hex[:6]}"


def msg(
    t: str,
    topic: str,
    payload: bytes = b"x",
    retain: bool = False,
    delay_s: int = 0,
    expiry_s: int | None = None,
    message_id: str = "",
) -> RoutedMessage:
    m = RoutedMessage(
        tenant=t,
        topic=topic,
        payload=payload,
        qos=1,
        retain=retain,
        delay_s=delay_s,
        publisher=Origin(client_id="pub", node_id="n1"),
        published_at_ms=int(time.time() * 1000),
        message_id=message_id or uuid.uuid4().hex,
    )
    if expiry_s is not None:
        m.properties.CopyFrom(MessageProperties(message_expiry_interval_s=expiry_s))
    return m


def test_fits_refuses_only_growth_past_a_cap() -> None:
    assert fits(2, 10, 1, 5, 3, 15)
    assert not fits(3, 10, 1, 0, 3, 0)  # one message too many
    assert not fits(0, 10, 1, 6, 0, 15)  # bytes
    assert fits(9, 99, 0, -5, 3, 15)  # over both caps, but shrinking
    assert fits(9, 99, 0, 0, 3, 15)
    assert fits(10**9, 10**12, 1, 1, 0, 0)  # 0: no cap


def test_usage_and_index_sizes_follow_puts_and_deletes() -> None:
    u = Usage()
    u.add("t", 10)
    u.add("t", 5)
    u.remove("t", 10)
    assert (u.count("t"), u.size("t")) == (1, 5)
    u.remove("t", 5)
    assert (u.count("t"), u.size("t")) == (0, 0)

    idx = RetainedIndex()
    idx.put("t", "a/b", Retained(b"12345", 0))
    idx.put("t", "a/b", Retained(b"12", 0))  # replaced: its old size goes
    idx.put("t", "a", Retained(b"1234", 0))
    assert (idx.count("t"), idx.size("t"), idx.size("other")) == (2, 6, 0)
    assert idx.delete("t", "a/b") and not idx.delete("t", "a/b")
    assert (idx.count("t"), idx.size("t")) == (1, 4)


async def test_delayed_messages_past_the_cap_are_refused_and_counted(router: RouterFactory) -> None:
    t, other = tenant(), tenant()
    p = await router(Caps(delayed_messages=3))
    first = msg(t, "$delayed/600/a")
    assert await p.route(first, msg(t, "$delayed/600/b"), msg(t, "$delayed/600/c")) == [OK] * 3
    assert await p.route(msg(t, "$delayed/600/d")) == [FULL]
    # The node retrying a message already held: still stored, not held (or counted) twice.
    assert await p.route(first) == [OK]
    assert await p.route(msg(other, "$delayed/600/a")) == [OK]  # another tenant: its own cap
    assert p.refusals.get("delayed_messages", t) == 1
    assert p.refusals.get("delayed_messages", other) == 0
    assert len(p.delayed.of_tenant(t)) == 3

    # A delayed will is never refused by the cap (and does not count against it).
    assert await p.route(msg(t, "will/pub", delay_s=60)) == [OK]
    assert p.delayed.count(t) == 3

    # Cancelling one makes room for one more.
    assert await p.delayed.cancel(t, first.message_id)
    assert await p.route(msg(t, "$delayed/600/e")) == [OK]
    assert await p.route(msg(t, "$delayed/600/f")) == [FULL]


async def test_the_delayed_cap_holds_across_a_restart(router: RouterFactory) -> None:
    t = tenant()
    p = await router(Caps(delayed_messages=2))
    assert await p.route(msg(t, "$delayed/600/a"), msg(t, "$delayed/600/b")) == [OK, OK]
    restarted = await router(Caps(delayed_messages=2))
    assert restarted.delayed.count(t) == 2
    assert await restarted.route(msg(t, "$delayed/600/c")) == [FULL]


async def test_delayed_bytes_cap(router: RouterFactory) -> None:
    t = tenant()
    p = await router(Caps(delayed_bytes=3000))
    assert await p.route(msg(t, "$delayed/600/a", b"x" * 1000)) == [OK]
    assert await p.route(msg(t, "$delayed/600/b", b"x" * 1000)) == [OK]
    assert await p.route(msg(t, "$delayed/600/c", b"x" * 1000)) == [FULL]
    assert await p.route(msg(t, "$delayed/600/d", b"x")) == [OK]  # a small one still fits
    assert p.refusals.get("delayed_bytes", t) == 1


async def test_a_due_delayed_message_frees_its_place(router: RouterFactory) -> None:
    t = tenant()
    p = await router(Caps(delayed_messages=1))
    scheduler = asyncio.create_task(p.scheduler.run())
    try:
        assert await p.route(msg(t, "$delayed/0/now")) == [OK]
        await eventually(lambda: p.delayed.count(t) == 0, 5, "the delayed count back at 0")
        assert await p.route(msg(t, "$delayed/600/next")) == [OK]
    finally:
        scheduler.cancel()


async def test_retained_count_cap_refuses_new_topics_only(router: RouterFactory) -> None:
    t, other = tenant(), tenant()
    p = await router(Caps(retained_messages=2))
    assert await p.route(msg(t, "r/1", retain=True), msg(t, "r/2", retain=True)) == [NO_MATCH] * 2
    assert await p.route(msg(t, "r/3", retain=True)) == [FULL]
    assert p.retained.get(t, "r/3") is None  # refused means not retained
    assert await p.route(msg(t, "r/1", b"new", retain=True)) == [NO_MATCH]  # replacing fits
    assert await p.route(msg(other, "r/3", retain=True)) == [NO_MATCH]
    assert p.refusals.get("retained_messages", t) == 1

    # Deleting (empty payload) always works, and frees room.
    assert await p.route(msg(t, "r/2", b"", retain=True)) == [NO_MATCH]
    assert await p.route(msg(t, "r/3", retain=True)) == [NO_MATCH]

    restarted = await router(Caps(retained_messages=2))
    assert restarted.retained.count(t) == 2
    assert await restarted.route(msg(t, "r/4", retain=True)) == [FULL]


async def test_retained_bytes_cap_and_shrinking_over_a_lowered_cap(router: RouterFactory) -> None:
    t = tenant()
    p = await router(Caps(retained_bytes=5000))
    assert await p.route(msg(t, "b/1", b"x" * 2000, retain=True)) == [NO_MATCH]
    assert await p.route(msg(t, "b/2", b"x" * 2000, retain=True)) == [NO_MATCH]
    assert await p.route(msg(t, "b/3", b"x" * 2000, retain=True)) == [FULL]
    assert await p.route(msg(t, "b/2", b"x" * 4000, retain=True)) == [FULL]  # growing one
    assert p.refusals.get("retained_bytes", t) == 2

    lowered = await router(Caps(retained_bytes=1000))  # restart with a smaller cap
    assert await lowered.route(msg(t, "b/1", b"x" * 100, retain=True)) == [NO_MATCH]
    assert await lowered.route(msg(t, "b/2", b"", retain=True)) == [NO_MATCH]
    assert lowered.retained.size(t) < 1000


async def test_expired_retained_messages_do_not_hold_the_cap(router: RouterFactory) -> None:
    t = tenant()
    p = await router(Caps(retained_messages=2))
    old = msg(t, "e/1", retain=True, expiry_s=1)
    old.published_at_ms -= 5000  # expired already
    assert await p.route(old, msg(t, "e/2", retain=True)) == [NO_MATCH, NO_MATCH]
    assert await p.route(msg(t, "e/3", retain=True)) == [NO_MATCH]
    assert p.retained.get(t, "e/1") is None and p.retained.count(t) == 2
    restarted = await router(Caps(retained_messages=2))
    assert restarted.retained.get(t, "e/1") is None  # purged from the store too
