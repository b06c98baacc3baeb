"""Attacks on the node's use of the message bus: a `$share` group name of 30 KB used to be
granted, its NATS subject overflowed the server's control line, the node's NATS connection
closed for good while it reported SERVING, and every later shared subscription on that node
got 0x80. Now the name is refused (it counts against the topic length limit), subjects are
bounded whatever the names (tests/common/test_topics.py), and shared subscriptions on the node
keep working while a bystander keeps its round trip."""

from __future__ import annotations

import asyncio
import uuid

from services.cli.status import component_status
from tests.conftest import MeshInfo
from tests.e2e.clients import Paho
from tests.poll import holds_within
from tests.security.bystander import Bystander, assert_unharmed


def _long_group_attack(port: int, rounds: int) -> list[int]:
    codes = []
    for i in range(rounds):
        attacker = Paho(port)
        attacker.connect()
        group = "g" * 30_000 + str(i)
        codes.append(int(attacker.subscribe(f"$share/{group}/bus/#", 1)[0].value))
        attacker.close()
    return codes


def _shared_still_works(port: int) -> list[bytes]:
    topic = f"bus/{uuid.uuid4().hex[:8]}"
    members = [Paho(port) for _ in range(2)]
    for m in members:
        m.connect()
        assert int(m.subscribe(f"$share/workers/{topic}", 1)[0].value) == 1
    pub = Paho(port)
    pub.connect()
    for i in range(10):
        assert int(pub.publish(topic, f"job-{i}", 1).value) == 0
    got: list[bytes] = []

    def all_ten() -> bool:
        for m in members:
            while not m.messages.empty():
                got.append(m.messages.get().payload)
        return len(got) >= 10

    holds_within(all_ten, 10, every_s=0.02)  # the caller compares what arrived
    for c in (*members, pub):
        c.close()
    return got


async def test_a_30kb_share_group_is_refused_and_the_node_keeps_its_bus(mesh: MeshInfo) -> None:
    port = mesh.node(0)
    async with Bystander(port) as b:
        codes = await asyncio.to_thread(_long_group_attack, port, 5)
    assert_unharmed(b)
    assert codes == [0x8F] * 5  # Topic Filter invalid: the group counts against its length
    status = await asyncio.to_thread(component_status, mesh.mesh.by_name("connection-0"))
    assert status == "SERVING"
    jobs = await asyncio.to_thread(_shared_still_works, port)
    assert sorted(jobs) == sorted(f"job-{i}".encode() for i in range(10))
