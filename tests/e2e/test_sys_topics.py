"""`$SYS` topics on a running mesh (docs/metrics.md): real MQTT clients of two fresh tenants
subscribe to `$SYS/#`; each sees its own figures (connected clients, PUBLISH messages
received) and its own clients' connect/disconnect events, never the other tenant's; `#`
alone receives no `$SYS` topic; a publish to `$SYS` is refused; the operator tenant
(`sys_operator_tenant`, "sysop" on the test mesh) sees the cluster's totals. The test mesh
publishes `$SYS` every second (tests/conftest.py)."""

from __future__ import annotations

import json
import queue
import uuid
from collections.abc import Callable

import paho.mqtt.client as mqtt

from tests.conftest import MeshInfo
from tests.e2e.admin import Admin
from tests.e2e.clients import Paho
from tests.poll import wait_until

OPERATOR = "sysop"


class Watcher:
    """A client subscribed to `$SYS/#`; keeps every message it got, in order."""

    def __init__(self, mesh: MeshInfo, node: int, tenant: str, filt: str = "$SYS/#") -> None:
        self.client = Paho(mesh.node(node), username=f"{tenant}/u", password="pw")
        self.client.connect()
        self.client.subscribe(filt)
        self.seen: list[mqtt.MQTTMessage] = []

    def drain(self) -> None:
        while True:
            try:
                self.seen.append(self.client.messages.get_nowait())
            except queue.Empty:
                return

    def latest(self, topic: str) -> bytes | None:
        self.drain()
        found = [m.payload for m in self.seen if m.topic == topic]
        return found[-1] if found else None

    def until(self, ok: Callable[[], bool], what: str, timeout_s: float = 20) -> None:
        """tests/poll.py's `wait_until`, failing with the topics seen so far."""
        wait_until(ok, timeout_s, lambda: f"{what}: saw {[m.topic for m in self.seen]}")

    def value_is(self, topic: str, want: bytes, what: str) -> None:
        self.until(lambda: self.latest(topic) == want, f"{what} ({topic} = {want!r})")

    def event(self, suffix: str) -> dict[str, object] | None:
        self.drain()
        for m in self.seen:
            if m.topic.endswith(suffix):
                return dict(json.loads(m.payload))
        return None


def _tenant(mesh: MeshInfo) -> str:
    tenant = f"s{uuid.uuid4().hex[:8]}"
    Admin(mesh).user(tenant, "u", "pw")
    return tenant


def _check_retained_for_a_late_client(mesh: MeshInfo, tenant: str) -> None:
    """A client arriving later gets the latest figures at once: they are retained."""
    late = Watcher(mesh, 1, tenant, "$SYS/broker/clients/+")
    late.until(lambda: late.latest("$SYS/broker/clients/connected") is not None, "retained")
    assert next(m for m in late.seen if m.topic.endswith("/connected")).retain
    late.client.close()


def _check_the_operator_sees_the_cluster(mesh: MeshInfo) -> None:
    """The operator's tenant sees the cluster: at least every client connected here."""
    ops = Watcher(mesh, 0, OPERATOR, "$SYS/broker/clients/connected")
    ops.until(
        lambda: int(ops.latest("$SYS/broker/clients/connected") or 0) >= 4,
        "the operator's cluster-wide count",
    )
    ops.client.close()


def _check_a_sees_its_figures(watch_a: Watcher) -> None:
    # A: its three clients (two watchers and the publisher), the five PUBLISHes it made.
    watch_a.value_is("$SYS/broker/clients/connected", b"3", "A's clients")
    watch_a.value_is("$SYS/broker/publish/messages/received", b"5", "A's publishes")
    # Each figure is its own retained message: the byte count may come a moment after the
    # message count of the same period. It counts every byte of every packet.
    bytes_in = "$SYS/broker/bytes/received"
    watch_a.until(lambda: int(watch_a.latest(bytes_in) or 0) > 5 * 5, "A's bytes received")


def test_each_tenant_sees_its_own_sys_figures_and_events_only(mesh: MeshInfo) -> None:
    a, b = _tenant(mesh), _tenant(mesh)
    Admin(mesh).user(OPERATOR, "u", "pw")
    watch_a = Watcher(mesh, 0, a)
    watch_b = Watcher(mesh, 1, b)
    everything_a = Watcher(mesh, 0, a, "#")  # `#` never matches `$SYS` [MQTT-4.7.2-1]
    pub = Paho(mesh.node(1), username=f"{a}/u", password="pw")
    pub.connect()
    connected = f"/clients/{pub.client_id}/connected"
    watch_a.until(lambda: watch_a.event(connected) is not None, "A's connected event")
    ev = watch_a.event(connected)
    assert ev is not None
    assert (ev["clientid"], ev["username"], ev["node"]) == (pub.client_id, "u", "connection-1")
    assert watch_a.seen[-1].topic.startswith("$SYS/brokers/connection-1/clients/")

    for i in range(5):
        pub.publish(f"x/{i}", b"hello", qos=1)
    _check_a_sees_its_figures(watch_a)
    # B: its own single client and nothing received, whatever A does.
    watch_b.value_is("$SYS/broker/clients/connected", b"1", "B's clients")
    watch_b.value_is("$SYS/broker/publish/messages/received", b"0", "B's publishes")

    _check_retained_for_a_late_client(mesh, a)

    pub.close()
    disconnected = f"/clients/{pub.client_id}/disconnected"
    watch_a.until(lambda: watch_a.event(disconnected) is not None, "A's disconnected event")
    assert watch_a.event(disconnected)["reason"] == "normal"  # type: ignore[index]

    _check_the_operator_sees_the_cluster(mesh)

    watch_b.drain()
    assert all(m.topic.startswith("$SYS/") for m in watch_b.seen)
    leaked = [m.topic for m in watch_b.seen if pub.client_id in m.topic + m.payload.decode()]
    assert not leaked, "B saw A's client"
    everything_a.drain()
    # `#` got A's own messages, and not one of the many `$SYS` ones published meanwhile.
    assert sorted(m.topic for m in everything_a.seen) == [f"x/{i}" for i in range(5)]
    for w in (watch_a, watch_b, everything_a):
        w.client.close()


def test_shared_subscriptions_count_apart_and_the_operator_sees_the_clusters_memory(
    mesh: MeshInfo,
) -> None:
    # Mosquitto counts `$share/...` subscriptions in shared_subscriptions/count only; here
    # from transient clients on both nodes and a persistent session (the router's figure).
    tenant = _tenant(mesh)
    watch = Watcher(mesh, 0, tenant, "$SYS/broker/+/count")  # itself one subscription
    a = Paho(mesh.node(0), username=f"{tenant}/u", password="pw")
    a.connect()
    a.subscribe("$share/g/jobs")
    a.subscribe("plain/+")
    b = Paho(mesh.node(1), username=f"{tenant}/u", password="pw")
    b.connect(clean_start=False, session_expiry=300)
    b.subscribe("$share/g/jobs")
    b.subscribe("$share/h/jobs")
    watch.value_is("$SYS/broker/shared_subscriptions/count", b"3", "shared subscriptions")
    watch.value_is("$SYS/broker/subscriptions/count", b"2", "the others")
    a.close()
    watch.value_is("$SYS/broker/shared_subscriptions/count", b"2", "A's gone")

    Admin(mesh).user(OPERATOR, "u", "pw")
    ops = Watcher(mesh, 0, OPERATOR, "$SYS/broker/heap/+")
    # Every reporting process's resident memory: more than one Python process's 10 MB.
    ops.until(lambda: int(ops.latest("$SYS/broker/heap/current") or 0) > 10 << 20, "cluster memory")
    ops.until(
        lambda: (
            int(ops.latest("$SYS/broker/heap/maximum") or 0)
            >= int(ops.latest("$SYS/broker/heap/current") or 0)
        ),
        "the largest memory seen",
    )
    mine = Watcher(mesh, 1, tenant, "$SYS/broker/heap/#")
    mine.client.nothing(1.0)  # a tenant's tree has no memory figures (retained: at once)
    b.close(session_expiry=0)
    for c in (ops.client, mine.client, watch.client):
        c.close()


def test_a_client_cannot_publish_to_sys(mesh: MeshInfo) -> None:
    tenant = _tenant(mesh)
    watch = Watcher(mesh, 0, tenant, "$SYS/forged/#")
    client = Paho(mesh.node(1), username=f"{tenant}/u", password="pw")
    client.connect()
    rc = client.publish("$SYS/forged/uptime", b"0 seconds", qos=1)
    assert rc is not None and rc.value == 0x87  # Not authorized
    watch.client.nothing(0.5)
    client.close()
    watch.client.close()
