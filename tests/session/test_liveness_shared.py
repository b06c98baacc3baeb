"""Node liveness decided on a shared record (services/session/liveness.py): a session
instance that stops hearing a node (the wrong side of a NATS split) does not release it
while another instance still hears it; once nobody does, it is released.

A Redis outage (redis-server paused with SIGSTOP: unreachable, as behind a cut link) does
not stop the answers (they say "unwritten"), and no instance releases a node answered
meanwhile: not the one that hears it, not one that does not (the other side of a NATS
split), not one that just got Redis back.

Real NATS and Redis (a database of its own, so that no other test's nodes are in it); the
outage tests have a nats-server and a redis-server of their own (`own_servers`: no other
session instance answers their heartbeats, and pausing Redis touches no other test). The
heartbeats are requests on `hb.node.<id>`, as a node sends them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from redis.asyncio import Redis

from services.cli.launcher import nats_binary
from services.cli.ports import free_port
from services.common.bus import subjects
from services.common.store.sqlite_session import SqliteSessionStore
from services.session.liveness import UNWRITTEN, NodeLiveness, SeenRecords
from services.session.registry import Holder, Registry
from services.session.sessions import Sessions
from tests.conftest import wait_port
from tests.poll import eventually, holds_within_async

TIMEOUT_S = 1.0
DB = 7
FENCE_S = 5.0  # a node's self_fence_s (default): it fences after this long unanswered
OUTAGE_S = 6.0  # longer than FENCE_S, and than a heartbeat write's time limit (3 s)
PASSWORD = "liveness-own-password"


@dataclass
class Servers:
    nats_url: str
    redis_url: str
    redis: subprocess.Popen[bytes]

    def pause_redis(self) -> None:
        self.redis.send_signal(signal.SIGSTOP)

    def resume_redis(self) -> None:
        self.redis.send_signal(signal.SIGCONT)


@contextlib.contextmanager
def own_servers(folder: Path) -> Iterator[Servers]:
    """A nats-server (JetStream) and a redis-server of the caller's own."""
    nats_port, redis_port = free_port(), free_port()
    conf = folder / "nats.conf"
    conf.write_text(
        f'listen: "127.0.0.1:{nats_port}"\njetstream {{ store_dir: "{folder}" }}\n'
        f'authorization {{ user: "own", password: "{PASSWORD}" }}\n'
    )
    out = subprocess.DEVNULL
    nats_proc = subprocess.Popen([nats_binary(), "-c", str(conf)], stdout=out, stderr=out)
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not installed"
    redis_proc = subprocess.Popen(
        [binary, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(folder), "--requirepass", PASSWORD],
        stdout=out,
        stderr=out,
    )  # fmt: skip
    try:
        wait_port(nats_port, nats_proc, "nats-server")
        wait_port(redis_port, redis_proc, "redis-server")
        yield Servers(
            f"nats://own:{PASSWORD}@127.0.0.1:{nats_port}",
            f"redis://:{PASSWORD}@127.0.0.1:{redis_port}/0",
            redis_proc,
        )
    finally:
        redis_proc.send_signal(signal.SIGCONT)
        for proc in (redis_proc, nats_proc):
            proc.kill()
            proc.wait(10)


async def _heartbeats(nc: nats.NATS, node: str, answers: list[bytes]) -> None:
    """The node's heartbeats, four a second, and the answers they got."""
    while True:
        with contextlib.suppress(Exception):
            reply = await nc.request(subjects.node_heartbeat(node), node.encode(), timeout=0.5)
            answers.append(reply.data)
        await asyncio.sleep(0.25)


async def test_an_instance_that_stops_hearing_a_node_does_not_release_it_while_another_does(
    nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    redis = Redis.from_url(redis_url.rsplit("/", 1)[0] + f"/{DB}")
    await redis.flushdb()
    store = SqliteSessionStore(tmp_path / "s.db")
    # Clean clients only: no session record to park.
    sessions = Sessions(store=store, router=None, queues=None, max_expiry_s=3600, events=None)  # type: ignore[arg-type]
    registry = Registry(redis)
    hearing = NodeLiveness(
        registry=registry, sessions=sessions, timeout_s=TIMEOUT_S, seen=SeenRecords(redis)
    )
    deaf = NodeLiveness(
        registry=registry, sessions=sessions, timeout_s=TIMEOUT_S, seen=SeenRecords(redis)
    )
    nc = await nats.connect(nats_url)
    node, tenant = f"live-{uuid.uuid4().hex[:6]}", f"t-{uuid.uuid4().hex[:6]}"
    await registry.claim(Holder(tenant, "c1", node, registry.next_epoch()))
    await hearing.start(nc)  # `deaf` never hears a heartbeat: it only checks
    answers: list[bytes] = []
    beating = asyncio.create_task(_heartbeats(nc, node, answers))
    try:
        # Must not happen: no release in four timeouts (each check could release).
        assert not await holds_within_async(deaf.check, 4 * TIMEOUT_S, every_s=0.1)
        assert deaf.silent_for(node) > TIMEOUT_S  # it does not hear the node itself
        assert answers and set(answers) <= {b"ok", b"new"}
        held = await registry.get(tenant, "c1")
        assert held is not None and held.node_id == node

        # Nobody hears it any more: released, by one instance, within a few timeouts.
        beating.cancel()

        async def released_by_either() -> list[str]:
            return await deaf.check() + await hearing.check()

        released = await eventually(released_by_either, 10 * TIMEOUT_S, "a release", every_s=0.1)
        assert released == [node]
        assert await registry.get(tenant, "c1") is None
    finally:
        beating.cancel()
        await nc.close()
        await store.close()
        await redis.flushdb()
        await redis.aclose()


async def _answered(nc: nats.NATS, node: str, answers: list[tuple[float, bytes]]) -> None:
    """The node's heartbeats as the node sends them: one every 0.25 s without waiting for
    the previous answer (each waits FENCE_S); (send time, answer) of those answered."""

    async def one() -> None:
        sent = time.monotonic()
        with contextlib.suppress(Exception):
            reply = await nc.request(subjects.node_heartbeat(node), node.encode(), FENCE_S)
            answers.append((sent, reply.data))

    tasks: set[asyncio.Task[None]] = set()
    while True:
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        await asyncio.sleep(0.25)


async def _checking(instances: list[NodeLiveness], released: list[str]) -> None:
    """Every instance's liveness check, ten times a second (a failed check goes on)."""
    while True:
        for instance in instances:
            with contextlib.suppress(Exception):
                released.extend(await instance.check())
        await asyncio.sleep(0.1)


def _sessions(tmp_path: Path) -> tuple[SqliteSessionStore, Sessions]:
    """Clean clients only: no session record to park."""
    store = SqliteSessionStore(tmp_path / "s.db")
    return store, Sessions(store=store, router=None, queues=None, max_expiry_s=3600, events=None)  # type: ignore[arg-type]


def _longest_unanswered(answers: list[tuple[float, bytes]], since: float, until: float) -> float:
    sends = sorted([since, *(t for t, _ in answers if since <= t <= until), until])
    return max(b - a for a, b in itertools.pairwise(sends))


def _liveness(registry: Registry, sessions: Any, redis: Redis) -> NodeLiveness:
    """An instance's liveness check on the shared records."""
    return NodeLiveness(
        registry=registry, sessions=sessions, timeout_s=TIMEOUT_S, seen=SeenRecords(redis)
    )


async def test_a_redis_outage_neither_stops_the_answers_nor_releases_the_node(
    tmp_path: Path,
) -> None:
    """Redis paused for longer than a node's fence time while the node heartbeats: every
    heartbeat is still answered ("unwritten"), so the node would not fence; and once Redis
    is back nothing is released, by the instance that hears the node or one that does not
    (the other side of a NATS split), while the node goes on heartbeating."""
    with own_servers(tmp_path) as servers:
        redis = Redis.from_url(servers.redis_url)
        store, sessions = _sessions(tmp_path)
        registry = Registry(redis)
        hearing, deaf = _liveness(registry, sessions, redis), _liveness(registry, sessions, redis)
        nc = await nats.connect(servers.nats_url)
        node, tenant = f"live-{uuid.uuid4().hex[:6]}", f"t-{uuid.uuid4().hex[:6]}"
        await registry.claim(Holder(tenant, "c1", node, registry.next_epoch()))
        await hearing.start(nc)
        answers: list[tuple[float, bytes]] = []
        released: list[str] = []
        background = [
            asyncio.create_task(_answered(nc, node, answers)),
            asyncio.create_task(_checking([hearing, deaf], released)),
        ]
        try:
            await eventually(lambda: len(answers) >= 4, 10, "answers before the outage")
            servers.pause_redis()
            paused_at = time.monotonic()
            await asyncio.sleep(OUTAGE_S)  # the outage itself
            servers.resume_redis()
            resumed_at = time.monotonic()
            during = [a for t, a in answers if paused_at <= t <= resumed_at - 3.5]
            assert during and set(during) == {UNWRITTEN}, "heartbeats unanswered in the outage"
            # The node would not have fenced: no FENCE_S without an answered heartbeat.
            longest = _longest_unanswered(answers, paused_at - 1, resumed_at - 3.5)
            assert longest < FENCE_S, f"{longest:.1f} s unanswered"

            # Back: written answers again, and nobody releases the node that kept beating.
            await eventually(lambda: any(t > resumed_at and a != UNWRITTEN for t, a in answers), 10)
            # Must not happen: a release in four timeouts (and a second) from here.
            assert not await holds_within_async(lambda: released, 4 * TIMEOUT_S + 1, 0.1)
            held = await registry.get(tenant, "c1")
            assert held is not None and held.node_id == node
        finally:
            for task in background:
                task.cancel()
            await nc.close()
            await store.close()
            await redis.aclose()


async def test_an_instance_that_just_got_redis_back_releases_nothing_for_the_timeout(
    tmp_path: Path,
) -> None:
    """A node silent by every record (nobody hears it), Redis paused and back: the instance
    releases nothing for `node_timeout_s` after Redis came back (an instance it cannot hear
    may have answered the node meanwhile without a record), then it does."""
    timeout_s = 3.0
    with own_servers(tmp_path) as servers:
        redis = Redis.from_url(servers.redis_url)
        store, sessions = _sessions(tmp_path)
        registry = Registry(redis)
        liveness = NodeLiveness(
            registry=registry, sessions=sessions, timeout_s=timeout_s, seen=SeenRecords(redis)
        )
        node, tenant = f"live-{uuid.uuid4().hex[:6]}", f"t-{uuid.uuid4().hex[:6]}"
        await registry.claim(Holder(tenant, "c1", node, registry.next_epoch()))
        released: list[str] = []
        try:
            await liveness.check()  # learns the node: silent from now on
            servers.pause_redis()
            checking = asyncio.create_task(_checking([liveness], released))
            await asyncio.sleep(timeout_s + 2)  # the outage: the node's record ages past it
            resumed_at = time.monotonic()
            servers.resume_redis()
            # Must not happen: a release until the timeout passed since Redis came back.
            window_s = resumed_at + timeout_s - 0.5 - time.monotonic()
            early = await holds_within_async(lambda: released, window_s, 0.1)
            assert not early, "released right after Redis came back"
            await eventually(lambda: released == [node], 4 * timeout_s, "the release")
            assert await registry.get(tenant, "c1") is None
            checking.cancel()
        finally:
            servers.resume_redis()
            await store.close()
            await redis.aclose()
