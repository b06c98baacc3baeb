"""The sweeper's timing wheel (services/connection/sweeper.py) with real channels on a
simulated clock: keep-alive and slow-consumer closes come on time, and an idle connection
is looked at about once a keep-alive period instead of every tick."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from services.common.mqtt import PingReq, Publish, encode
from services.connection import conn as conn_module
from services.connection.channel import Action, Channel, ChannelConfig
from services.connection.conn import Conn
from services.connection.persistence import DeliveryDeps, PersistentDelivery
from services.connection.queue_poll import POLL_MIN_S
from services.connection.registry import Registry
from services.connection.sweeper import TICK_S, Sweeper
from services.queue.client import Notice
from tests.connection.harness import connected, written
from tests.connection.persistence_fakes import FakeNats, FakeQueue, _entry, _settle


class Sink:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


class Node:
    """The node's part: a close the sweeper asks for ends the connection."""

    def __init__(self, registry: Registry, clock: list[float], queue: object = None) -> None:
        self.registry = registry
        self.clock = clock
        self.sweeper = Sweeper(
            node_id="n",
            registry=registry,
            nc=None,  # type: ignore[arg-type]
            carry_out=self.carry_out,
            mark_dirty=lambda c: None,
            queue=queue,  # type: ignore[arg-type]
        )
        self.closed_at: dict[Conn, float] = {}

    def carry_out(self, conn: Conn, actions: list[Action]) -> None:
        if actions and not conn.closed:
            self.cleanup(conn)
            self.closed_at[conn] = self.clock[0]

    def mark_dirty(self, conn: Conn) -> None:
        pass

    def cleanup(self, conn: Conn) -> None:
        conn.closed = True
        self.registry.closed(conn, self.clock[0])
        self.sweeper.forget(conn)

    def sweep_at(self, conn: Conn, at: float) -> None:
        self.sweeper.schedule(conn, at)


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> Counter[int]:
    """How often each channel (by id) was ticked."""
    seen: Counter[int] = Counter()
    tick = Channel.tick

    def counted(self: Channel, now: float) -> list[Action]:
        seen[id(self)] += 1
        return tick(self, now)

    monkeypatch.setattr(Channel, "tick", counted)
    return seen


def _open(node: Node, keepalive_s: int, config: ChannelConfig | None = None) -> Conn:
    ch, _ = connected(4, keepalive_s=keepalive_s, config=config)  # CONNECT at t=0
    conn = Conn(node, ch, Sink())
    node.registry.opened(conn)
    node.sweeper.schedule(conn, node.clock[0])  # as Node.open does
    return conn


def _run(node: Node, clock: list[float], until: float, each: object = None) -> None:
    while clock[0] < until:
        clock[0] += TICK_S
        if callable(each):
            each(clock[0])
        node.sweeper.tick(clock[0])


def test_keep_alive_closes_come_on_time_and_idle_channels_are_seldom_looked_at(
    looks: Counter[int],
) -> None:
    clock = [0.0]
    node = Node(Registry(), clock)
    idle = [_open(node, keepalive_s=60) for _ in range(200)]
    talking = _open(node, keepalive_s=60)

    def ping(now: float) -> None:
        if now % 30 == 0:  # a PINGREQ every half keep-alive
            talking.channel.receive(encode(PingReq(), 4), now)

    _run(node, clock, 200.0, ping)
    # Silent for more than 1.5 x 60 s since the CONNECT at 0: closed at the first tick after.
    assert sorted({node.closed_at[c] for c in idle}) == [90.0 + TICK_S]
    assert talking not in node.closed_at and not talking.closed
    # Each idle channel: its first look, and the one at its deadline (every tick: 180 each).
    assert max(looks[id(c.channel)] for c in idle) <= 3
    assert looks[id(talking.channel)] <= 200 // 30 + 3


def test_a_congestion_that_starts_between_looks_still_closes_on_time(
    looks: Counter[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr(conn_module, "time", SimpleNamespace(time=lambda: clock[0]))
    node = Node(Registry(), clock)
    slow = _open(node, keepalive_s=0, config=ChannelConfig(slow_consumer_timeout_s=5.0))
    _run(node, clock, 10.0)
    assert looks[id(slow.channel)] == 1  # no keep-alive, not congested: nothing to look for
    slow.writable(False)  # its socket stopped taking bytes at t=10
    _run(node, clock, 30.0)
    assert node.closed_at[slow] == 15.0 + TICK_S


def test_a_closed_connection_leaves_the_wheel_at_once(looks: Counter[int]) -> None:
    """A closed connection is not held until its keep-alive would have ended (an hour
    here): under churn that would keep every closed connection's memory that long."""
    clock = [0.0]
    node = Node(Registry(), clock)
    conns = [_open(node, keepalive_s=3600) for _ in range(100)]
    _run(node, clock, 2.0)
    assert node.sweeper.watched == 100
    for c in conns[:60]:
        node.cleanup(c)  # the clients left
    assert node.sweeper.watched == 40
    _run(node, clock, 10.0)
    assert node.sweeper.watched == 40 and not node.closed_at


async def test_a_persistent_session_is_looked_at_when_its_poll_is_due(
    looks: Counter[int],
) -> None:
    """An idle persistent session (no keep-alive) is looked at when its safety-net poll is
    due, not every second; a notice heard after a long quiet brings the next look within
    POLL_MIN_S (the next lost notice is found that soon); and when the queue client's
    generation moves, every persistent session polls in the next tick."""
    clock = [0.0]
    queue = FakeQueue([])
    node = Node(Registry(), clock, queue)
    ch, dec = connected(4, keepalive_s=0)
    conn = Conn(node, ch, Sink())
    node.registry.opened(conn)
    node.sweeper.schedule(conn, 0.0)
    conn.persistent = pd = PersistentDelivery(
        channel=ch,
        deps=DeliveryDeps(queue=queue, nc=FakeNats(), now=lambda: clock[0]),  # type: ignore[arg-type]
        tenant="t",
        queue_id="q",
        wrote=lambda: None,
        wake=lambda at: node.sweep_at(conn, at),
    )
    await pd.start()

    async def run(until: float) -> None:
        while clock[0] < until:
            clock[0] += TICK_S
            node.sweeper.tick(clock[0])
            await _settle()

    await run(120.0)
    reads = queue.reads
    # Polls 1, 2, 4, 8, 16, 16, ... s apart (20% jitter): about 11 in two minutes, one look
    # each (a look every second was 120).
    assert 7 <= reads <= 13
    assert looks[id(ch)] <= reads + 3
    queue.entries.append(_entry(1))
    pd._notice(Notice(last_seq=1))  # heard after a long quiet: read at once, look soon
    await _settle()
    assert queue.reads > reads
    queue.entries.append(_entry(2))  # its notice is lost
    await run(clock[0] + POLL_MIN_S + 2 * TICK_S)
    assert [p.payload for p in written(ch, dec) if isinstance(p, Publish)] == [b"m1", b"m2"]
    await run(clock[0] + 60.0)  # quiet again: long intervals
    before = queue.reads
    queue.generation += 1  # e.g. a queue link broke: notices may have been lost
    await run(clock[0] + TICK_S)
    assert queue.reads > before
    await pd.close()
