"""SIGKILL of the queue instance that owns a durable shared group's queue while messages
flow to the group: every message acknowledged to the publisher reaches some member. With the
SQLite store and two queue instances (the survivor takes the partition over and starts the
group's hand-out again from the stored acked_through), and with the tenant's queues on Redis
Streams (the one queue instance killed and started again)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import nats
import paho.mqtt.client as mqtt
import pytest
from redis import Redis

from services.cli.launcher import Launcher
from services.cli.ports import free_port
from services.common.bus.unary import QUEUE_OWNERS_SUBJECT
from services.common.group_routes import group_queue_id
from services.queue.core import partition_of
from starling.queue.v1 import queue_pb2
from tests.poll import wait_until
from tests.queue.test_redis_queue_kill import PASSWORD, DurableRedis
from tests.shared_groups.conftest import Member, group_launcher, group_state, members, node_port

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def two_queues(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    folder: Path = tmp_path_factory.mktemp("groups-two-queues")
    env = {"STARLING_NODE_TIMEOUT_S": "3"}
    with group_launcher(folder, instances={"queue": 2}, env=env) as launcher:
        yield launcher


@pytest.fixture(scope="module")
def redis_queues(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    redis = DurableRedis(tmp_path_factory.mktemp("groups-queues-redis"), free_port())
    redis.start()
    env = {"STARLING_QUEUE_STORE_DEFAULT": "redis", "STARLING_QUEUE_REDIS_URL": redis.url}
    try:
        with group_launcher(tmp_path_factory.mktemp("groups-redis"), env=env) as launcher:
            launcher.queues_redis_port = redis.port  # type: ignore[attr-defined]
            yield launcher
    finally:
        redis.kill()


class Flow(threading.Thread):
    """A QoS 1 publisher (MQTT 5) at a steady pace; `acked`: the payloads PUBACKed with
    success."""

    def __init__(self, port: int, topic: str) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.c.max_inflight_messages_set(50)
        self.c.max_queued_messages_set(0)
        self.mids: dict[int, str] = {}
        self.acked: set[str] = set()
        self.c.on_publish = self._on_publish
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        self.halt = threading.Event()
        self.sent = 0

    def _on_publish(self, c: object, u: object, mid: int, rc: mqtt.ReasonCode, p: object) -> None:
        payload = self.mids.get(mid)
        if payload is not None and rc.value < 0x80:
            self.acked.add(payload)

    def run(self) -> None:
        while not self.halt.is_set():
            payload = str(self.sent)
            info = self.c.publish(self.topic, payload, 1)
            self.mids[info.mid] = payload
            self.sent += 1
            time.sleep(0.004)

    def stop(self) -> None:
        self.halt.set()
        self.join(5)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def _owner(launcher: Launcher, qid: str) -> str:
    """The launcher name of the queue instance that owns `qid`'s partition (from the
    instances' announcements on NATS, every second)."""
    password = launcher.secrets.nats["operator"]
    url = f"nats://operator:{password}@127.0.0.1:{launcher.mesh.by_name('nats').port}"

    async def listen() -> str:
        nc = await nats.connect(url)
        heard: asyncio.Queue[queue_pb2.QueueOwners] = asyncio.Queue()

        async def on(msg: object) -> None:
            await heard.put(queue_pb2.QueueOwners.FromString(msg.data))  # type: ignore[attr-defined]

        await nc.subscribe(QUEUE_OWNERS_SUBJECT, cb=on)
        try:
            while True:
                a = await asyncio.wait_for(heard.get(), 10)
                if partition_of("default", qid, a.partition_count) in a.partitions:
                    return a.instance_id.rsplit("-", 1)[0]
        finally:
            await nc.close()

    return asyncio.run(listen())


def _arrived(ms: list[Member]) -> set[str]:
    return {p for m in ms for p in m.payloads()}


def _through_a_kill(
    launcher: Launcher, group: str, topic: str, kill: Callable[[str], None]
) -> tuple[int, int]:
    """Members on both nodes, a flow from node 0, `kill(owner)` mid-flow; every
    acknowledged message arrives. Returns (acknowledged, arrived)."""
    ms = members(launcher, 2, f"$share/{group}/{topic}", receive_maximum=20)
    flow = Flow(node_port(launcher, 0), topic)
    flow.start()
    try:
        wait_until(lambda: len(_arrived(ms)) >= 300, 30, "the group's flow")
        owner = _owner(launcher, group_queue_id(group, topic))
        kill(owner)
        at = flow.sent
        wait_until(lambda: len(flow.acked) >= at + 300, 60, "acknowledgements after the kill")
    finally:
        flow.stop()
    acked = set(flow.acked)

    def missing() -> str:
        return f"{len(acked - _arrived(ms))} of {len(acked)} acknowledged not arrived"

    wait_until(lambda: acked <= _arrived(ms), 60, missing)
    total = sum(len(m.payloads()) for m in ms)
    print(
        f"group queue kill: acknowledged {len(acked)}, arrived {len(_arrived(ms))}, "
        f"twice {total - len(_arrived(ms))}, members {[len(m.payloads()) for m in ms]}"
    )
    flow.close()
    for m in ms:
        m.close()
    return len(acked), len(_arrived(ms))


def _names() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"k{tag}", f"kill/{tag}"


def test_sigkill_of_the_group_queues_owner_sqlite(two_queues: Launcher) -> None:
    group, topic = _names()
    acked, arrived = _through_a_kill(two_queues, group, topic, two_queues.kill)
    assert acked >= 600 and arrived >= acked
    assert group_state(two_queues, group, topic) is not None  # the queue was in SQLite


def test_sigkill_of_the_group_queues_owner_redis(redis_queues: Launcher) -> None:
    def kill_and_restart(owner: str) -> None:
        redis_queues.kill(owner)
        redis_queues.restart(owner)

    group, topic = _names()
    acked, arrived = _through_a_kill(redis_queues, group, topic, kill_and_restart)
    assert acked >= 600 and arrived >= acked
    assert group_state(redis_queues, group, topic) is None  # not in SQLite: on Redis
    port = redis_queues.queues_redis_port  # type: ignore[attr-defined]
    with Redis(port=port, password=PASSWORD) as r:
        assert any(True for _ in r.scan_iter(match=f"*{group}*", count=1000))
