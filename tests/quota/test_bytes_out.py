"""The outbound bandwidth limit (bytes_out_per_s) on one channel, without I/O but with the
node's lease bookkeeping (NodeQuota) against a scripted quota service: QoS 0 over the budget
is dropped and counted, QoS 1/2 is held (never dropped) and goes out when a lease answers, a
message larger than the balance still goes (the debt is one message), and a tenant without
the limit is untouched."""

from __future__ import annotations

import asyncio
import time

from services.common.connect import ConnectOutcome
from services.common.message import Message
from services.common.mqtt import EMPTY, Connect, Decoder, Publish, encode
from services.connection.channel import Channel
from services.connection.quota import NodeQuota
from services.quota.client import Lease, LeaseResult
from tests.connection.harness import PLAIN, written
from tests.poll import eventually

LIMIT = 1000  # bytes per second
MSG = 100  # payload + topic of each test message


class Windows:
    """A quota service for one budget: `LIMIT` per window, handed out as asked; the test
    opens the next window by hand (`next_window`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit
        self.asked: list[tuple[str, str, int]] = []
        self.ttl_ms = 60_000  # the window's end, as far as the node is told

    async def acquire_lease(
        self, tenant: str, node_id: str, resource: str, amount: int, user: str = ""
    ) -> Lease:
        self.asked.append((tenant, resource, amount))
        if resource != "bytes_out_per_s" or tenant != "t" or user:
            return Lease(LeaseResult.GRANTED, amount, 1000, 0)  # unlimited
        granted = min(amount, self.left)
        self.left -= granted
        result = LeaseResult.GRANTED if granted else LeaseResult.EXCEED_LIMIT
        return Lease(result, granted, self.ttl_ms, self.limit)

    def next_window(self) -> None:
        self.left = self.limit

    async def close(self) -> None:
        pass


def _msg(qos: int, n: int) -> Message:
    return Message("t", "a/b", b"%03d" % n + b"x" * (MSG - 6), qos, False)


async def _settle() -> None:
    for _ in range(20):  # the lease tasks answer at once (no I/O): a few loop turns
        await asyncio.sleep(0)


def _channel(quota: NodeQuota, tenant: str = "t") -> tuple[Channel, Decoder, list[int]]:
    ch = Channel(PLAIN, "peer", 0.0, lambda: "c", gates=quota.gate)
    woken: list[int] = []
    ch.on_resume = lambda: (woken.append(1), ch.outbound.resume(1.0))  # type: ignore[func-returns-value]
    ch.receive(encode(Connect("c", 5, keepalive_s=0, properties=EMPTY), 5), 0.0)
    ch.authenticated(ConnectOutcome(tenant=tenant, epoch=1, identity=f"{tenant}/u"), 0.0)
    dec = Decoder(5)
    written(ch, dec)  # the CONNACK
    return ch, dec, woken


def _quota(service: Windows, refused: list[tuple[str, str]]) -> NodeQuota:
    return NodeQuota(
        node_id="n1",
        client=service,  # type: ignore[arg-type]
        on_refused=lambda limit, tenant: refused.append((limit, tenant)),
    )


async def _primed(
    service: Windows, refused: list[tuple[str, str]]
) -> tuple[NodeQuota, Channel, Decoder, list[int]]:
    """A channel whose buckets know their limit (the first delivery asks; it goes)."""
    quota = _quota(service, refused)
    ch, dec, woken = _channel(quota)
    ch.deliver(_msg(0, 0), 0, False, (), 1.0)
    await _settle()
    assert len(written(ch, dec)) == 1  # unknown limit: admitted while the lease is asked for
    return quota, ch, dec, woken


async def test_qos0_over_the_budget_is_dropped_and_counted() -> None:
    service, refused = Windows(LIMIT), []
    quota, ch, dec, _ = await _primed(service, refused)
    for i in range(1, 31):
        ch.deliver(_msg(0, i), 0, False, (), 1.0)
        await _settle()
    got = written(ch, dec)
    # One window's worth (1000 bytes: 10 messages, the first one went before the limit was
    # known) plus at most the credit of the lease in flight; nothing beyond.
    assert 8 <= len(got) <= 12, len(got)
    ob = ch.outbound
    assert ob.dropped_quota == 30 - len(got) and ob.dropped == ob.dropped_quota
    assert refused == [("bytes_out_per_s", "t")] * ob.dropped_quota
    await quota.stop()


async def test_qos1_is_held_not_dropped_and_goes_when_the_next_window_grants() -> None:
    service, refused = Windows(LIMIT), []
    quota, ch, dec, woken = await _primed(service, refused)
    for i in range(1, 31):
        ch.deliver(_msg(1, i), 1, False, (), 1.0)
        await _settle()
    first = [p for p in written(ch, dec) if isinstance(p, Publish)]
    assert 8 <= len(first) <= 12
    ob = ch.outbound
    assert ob.dropped == 0 and refused == []
    assert ob.pending is not None and len(ob.pending) == 30 - len(first)
    sent = [p.payload[:3] for p in first]
    windows = 0
    while ob.pending and windows < 5:  # each window lets ~10 more go, woken by the lease
        windows += 1
        service.next_window()
        bucket = quota._buckets[("t", "", "bytes_out_per_s")]
        bucket.expires = bucket.not_before = 0.0  # the window ended (the clock is real)
        before = len(woken)
        quota._want(bucket)
        await _settle()
        assert len(woken) > before
        sent += [p.payload[:3] for p in written(ch, dec) if isinstance(p, Publish)]
    assert sent == [b"%03d" % i for i in range(1, 31)]  # every one, in order, none dropped
    assert not ob.pending
    assert windows == 2  # ~10 a window: the limit held
    assert ob.dropped == 0
    await quota.stop()


async def test_a_message_larger_than_every_grant_still_goes() -> None:
    service, refused = Windows(LIMIT), []
    quota, ch, dec, _ = await _primed(service, refused)
    big = Message("t", "a/b", b"x" * (5 * LIMIT), 1, False)
    ch.deliver(big, 1, False, (), 1.0)
    await _settle()
    assert [p.payload for p in written(ch, dec) if isinstance(p, Publish)] == [big.payload]
    await quota.stop()


async def test_a_spent_window_asks_again_when_the_next_starts() -> None:
    """No delivery arrives to ask: the held connection itself gets the next lease asked."""
    service, refused = Windows(LIMIT), []
    quota = _quota(service, refused)
    ch, dec, woken = _channel(quota)
    bucket = quota._buckets[("t", "", "bytes_out_per_s")]
    ch.deliver(_msg(1, 0), 1, False, (), 1.0)
    await _settle()
    service.left = 0  # the rest of the window went to other nodes
    service.ttl_ms = 100  # and it ends in 100 ms
    for i in range(1, 40):
        ch.deliver(_msg(1, i), 1, False, (), 1.0)
        await _settle()
    assert bucket.not_before > time.monotonic()  # told the window is spent
    early = written(ch, dec)  # the first one or two, before the limit was known
    assert len(early) <= 2 and ch.outbound.pending
    service.next_window()
    woken.clear()
    await eventually(lambda: woken, 2, "the wake at the window's end")  # the timer asked
    assert written(ch, dec)
    await quota.stop()


async def test_a_tenant_without_the_limit_is_never_held() -> None:
    service, refused = Windows(LIMIT), []
    quota = _quota(service, refused)
    ch, dec, _ = _channel(quota, tenant="other")
    n = 0
    for _ in range(200):
        ch.deliver(Message("other", "a/b", b"x" * 200, 0, False), 0, False, (), 1.0)
        await _settle()
        n += len(written(ch, dec))
    assert n == 200 and refused == []
    assert ch.outbound.free_window > 0
    await quota.stop()


async def test_qos0_is_never_dropped_while_the_first_lease_is_on_its_way() -> None:
    """Every budget of every tenant starts unknown on every node (its limit comes with the
    first lease, a few ms later): QoS 0 deliveries meanwhile go, none is dropped; QoS 1
    beyond the first waits for the answer instead."""
    service, refused = Windows(LIMIT), []
    quota = _quota(service, refused)
    ch, dec, _ = _channel(quota)
    for i in range(5):  # all before any lease answered (no loop turn in between)
        ch.deliver(_msg(0, i), 0, False, (), 1.0)
    assert len(written(ch, dec)) == 5
    assert ch.outbound.dropped == 0 and refused == []
    for i in range(5, 8):
        ch.deliver(_msg(1, i), 1, False, (), 1.0)
    assert len([p for p in written(ch, dec) if isinstance(p, Publish)]) <= 1
    await quota.stop()


async def test_the_gate_is_on_the_delivery_path_only_while_the_limit_exists() -> None:
    """Limits change at runtime (`ctl.quota.limits`): a connection of a tenant without the
    limit does not consult the gate per delivery, takes it on when the limit is set and off
    again when it is removed, all without reconnecting."""
    service, refused = Windows(0), []  # no limit yet
    quota = _quota(service, refused)
    ch, dec, _ = _channel(quota)
    ob = ch.outbound
    assert ob.gate is not None  # not known yet: the first delivery asks
    ch.deliver(_msg(0, 0), 0, False, (), 1.0)
    await _settle()
    assert ob.gate is None  # unlimited: off the delivery path
    service.limit = service.left = LIMIT
    quota.limits_changed("t")
    assert ob.gate is not None
    for i in range(1, 31):
        ch.deliver(_msg(0, i), 0, False, (), 1.0)
        await _settle()
    got = written(ch, dec)
    assert 9 <= len(got) <= 13, len(got)  # the first, then about one window's worth
    assert ob.dropped_quota == 31 - len(got) > 0
    service.limit = 0
    quota.limits_changed("t")
    for i in range(100):
        ch.deliver(_msg(0, i), 0, False, (), 1.0)
        await _settle()
    assert ob.gate is None
    assert len(written(ch, dec)) == 100 and ob.dropped_quota == 31 - len(got)
    await quota.stop()
