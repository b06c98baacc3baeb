"""Wills when a node is SIGKILLed (fault suite's mesh, `fault_mesh`): a subscriber on the
surviving node, and a rule on the wills' topics, get exactly the wills MQTT says are due.
The other exact-script kills: tests/faults/test_kills.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt
import pytest

from services.cli.launcher import Launcher
from services.common.mqtt import ConnAck, Connect, Disconnect, Will
from services.common.mqtt.properties import Properties
from services.rules.admin_client import RulesAdminClient
from services.session.client import SessionAdminClient
from tests.e2e.clients import Raw
from tests.faults.test_kills import port
from tests.poll import holds_within, wait_until

# Wills are awaited within the times MQTT and the node timeout set: with nothing else running
# (docs/testing.md).
pytestmark = pytest.mark.timed


@dataclass(frozen=True, slots=True)
class WillsSeen:
    """What the subscriber got: the wills with when they came, and the rule's copies."""

    got: list[tuple[bytes, float]] = field(default_factory=list)
    ruled: list[bytes] = field(default_factory=list)
    subacked: threading.Event = field(default_factory=threading.Event)

    def on_message(self, cl: object, u: object, m: mqtt.MQTTMessage) -> None:
        if m.topic.startswith("ruled/"):  # the rule's row (SELECT *) as JSON
            self.ruled.append(json.loads(m.payload)["payload"].encode())
        else:
            self.got.append((m.payload, time.monotonic()))


async def _wills_rule(launcher: Launcher, topic: str, create: bool) -> None:
    """Create (or delete) a rule that republishes every will under `ruled/`."""
    rules_addr = f"127.0.0.1:{launcher.mesh.by_name('rules').grpc_port}"
    rule_id = f"wills-{topic[6:]}"
    admin = RulesAdminClient(rules_addr, launcher.admin_token)
    try:
        if create:
            await admin.create(
                "default",
                rule_id,
                f'SELECT * FROM "{topic}/#"',
                [("republish", {"topic": f"ruled/{topic[6:]}/${{clientid}}", "qos": "1"})],
            )
        else:
            await admin.delete("default", rule_id)
    finally:
        await admin.close()


def _watcher(launcher: Launcher, topic: str, seen: WillsSeen) -> mqtt.Client:
    """A subscriber on node 0 to the wills and the rule's copies (`seen.subacked` is set
    once its SUBACK came)."""
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
    sub.on_message = seen.on_message
    sub.on_subscribe = lambda *_: seen.subacked.set()
    sub.connect("127.0.0.1", port(launcher, 0))
    sub.loop_start()
    sub.subscribe([(f"{topic}/#", 1), (f"ruled/{topic[6:]}/#", 1)])
    return sub


def _will_client(
    launcher: Launcher,
    topic: str,
    name: str,
    node: int,
    *,
    v5: bool,
    delay: int = 0,
    clean: bool = True,
) -> Raw:
    """A client of node `node` whose will says "`name` gone" after `delay` seconds."""
    raw = Raw(port(launcher, node))
    props = Properties(session_expiry_interval=60) if v5 and delay else Properties()
    will = Will(
        f"{topic}/{name}",
        f"{name} gone".encode(),
        1,
        properties=Properties(will_delay_interval=delay) if delay else Properties(),
    )
    ack = raw.connect(
        Connect(
            f"w-{name}-{topic[6:]}", 5 if v5 else 4, clean_start=clean, will=will, properties=props
        )
    )
    assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
    return raw


async def _registered(launcher: Launcher, client_id: str) -> bool:
    address = f"127.0.0.1:{launcher.mesh.by_name('session').grpc_port}"
    admin = SessionAdminClient(address, launcher.admin_token)
    try:
        return any(c.client_id == client_id for c in await admin.list_clients("default"))
    finally:
        await admin.close()


def _clients_on_node_1(launcher: Launcher, topic: str) -> dict[str, Raw]:
    """Six clients with wills on node 1; the polite one leaves with DISCONNECT (no will).
    The caller keeps them until the node is killed: a Raw dropped closes its socket, and
    the node would then publish that will itself."""
    held = {
        "plain": _will_client(launcher, topic, "plain", 1, v5=False),  # 3.1.1, will at QoS 1
        "delayed": _will_client(launcher, topic, "delayed", 1, v5=True, delay=6, clean=False),
        "back": _will_client(launcher, topic, "back", 1, v5=True, delay=30, clean=False),
        "restart": _will_client(launcher, topic, "restart", 1, v5=True, delay=30, clean=False),
        "takeover": _will_client(launcher, topic, "takeover", 1, v5=True),
        "polite": _will_client(launcher, topic, "polite", 1, v5=True),
    }
    held["polite"].send(Disconnect())
    assert held["polite"].closed()
    wait_until(  # its release is done
        lambda: not asyncio.run(_registered(launcher, f"w-polite-{topic[6:]}")),
        10,
        "the polite client's release",
    )
    return held


def _check_the_wills(seen: WillsSeen, want: set[bytes], killed: float) -> None:
    got, ruled = seen.got, seen.ruled
    wait_until(lambda: want <= {p for p, _ in got}, 25, lambda: f"the wills; published: {got}")
    wait_until(lambda: want <= set(ruled), 10, lambda: f"the wills; the rule saw: {ruled}")
    # Must not happen: a will that should not come would come within this window.
    extra = holds_within(lambda: len(got) > len(want) or len(ruled) > len(want), 1.5)
    assert not extra, f"wills that should not come: {got}, {ruled}"
    assert sorted(p for p, _ in got) == sorted(want)
    assert sorted(ruled) == sorted(want)
    at = {p: t - killed for p, t in got}
    # The delayed one waited for its delay, counted from the node's death.
    assert at[b"delayed gone"] >= 5.0, at


def test_wills_of_a_killed_nodes_clients_are_published(fault_mesh: Launcher) -> None:
    """Node 1 is SIGKILLed with six clients on it; a subscriber on node 0 gets the wills
    MQTT says are due: the dead node's clients' once the session service declares it dead
    (3 s here), one with a 6 s Will Delay Interval after what is left of it, those of clients
    whose takeover finds the node gone and whose will is due (delay 0; a clean start ends
    the session whatever the delay), and neither the will of a client back within its delay
    nor that of one that sent DISCONNECT. A rule on the wills' topics sees the same ones (its
    republished copies)."""
    topic = f"wills/{uuid.uuid4().hex[:6]}"
    seen = WillsSeen()
    asyncio.run(_wills_rule(fault_mesh, topic, create=True))
    sub = _watcher(fault_mesh, topic, seen)
    try:
        # The SUBSCRIBE goes out with the connection; paho does not wait for the SUBACK.
        wait_until(seen.subacked.is_set, 10, "the SUBACK")
        held = _clients_on_node_1(fault_mesh, topic)
        fault_mesh.kill("connection-1")
        killed = time.monotonic()
        for raw in held.values():  # connected until the kill (see _clients_on_node_1)
            raw.close()
        # Back on node 0 at once: within its 30 s delay (session resumed: no will), with a
        # clean start (the old session ends: its will is due), and with delay 0.
        back = _will_client(fault_mesh, topic, "back", 0, v5=True, delay=30, clean=False)
        restart = _will_client(fault_mesh, topic, "restart", 0, v5=True, delay=30, clean=True)
        again = _will_client(fault_mesh, topic, "takeover", 0, v5=True)
        want = {b"plain gone", b"delayed gone", b"takeover gone", b"restart gone"}
        _check_the_wills(seen, want, killed)
        for raw in (back, restart, again):
            raw.send(Disconnect())
    finally:
        sub.disconnect()
        sub.loop_stop()
        asyncio.run(_wills_rule(fault_mesh, topic, create=False))
        fault_mesh.restart("connection-1")
