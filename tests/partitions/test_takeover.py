"""A client id taken over while the node holding it is cut off from NATS and Redis.

Client X is connected (persistent session) through HAProxy to node-0; node-0 loses NATS and
Redis (its clients still reach it); X's client id then connects again, through HAProxy, to
node-1 (a device that reconnected over another path, or a second device with the same id).
MQTT allows one live connection per client id [MQTT-3.1.4-3]: the old one must be closed.

node-0 cannot hear the takeover's kick, but its heartbeats go unanswered, so it fences
itself after `self_fence_s` (services/connection/lease.py), before the session service
releases its clients (`node_timeout_s`, services/session/liveness.py): the old connection
is told DISCONNECT 0x9C during the partition, and after the heal X is still connected once,
to node-1.
"""

from __future__ import annotations

from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.partitions.cluster import NATS_HOSTS, NATS_PORT, REDIS_PORT, Cluster
from tests.partitions.load import Balancer
from tests.partitions.run import mesh_back
from tests.poll import holds_within, wait_until

pytestmark = [pytest.mark.partitions, pytest.mark.timed]


class Device:
    """A paho MQTT 5 client with a persistent session that does not reconnect by itself."""

    def __init__(self, client_id: str, lb_port: int) -> None:
        self.connacks: list[bool] = []  # session present, per successful CONNACK
        self.closed = False
        self.c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=False,
        )
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = self._on_disconnect
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 600
        self.c.connect("127.0.0.1", lb_port, keepalive=10, clean_start=False, properties=props)
        self.c.loop_start()

    def _on_connect(self, c: Any, u: Any, flags: Any, rc: Any, p: Any) -> None:
        if not rc.is_failure:
            self.connacks.append(bool(flags.session_present))

    def _on_disconnect(self, c: Any, u: Any, f: Any, rc: Any, p: Any) -> None:
        self.closed = True

    def node(self, lb: Balancer) -> str | None:
        """The node its open connection goes to, if any."""
        sock = self.c.socket()
        if sock is None or self.closed:
            return None
        return dict(lb.sessions()).get(sock.getsockname()[1])

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def connect_to(node: str, client_id: str, c: Cluster, lb: Balancer) -> Device:
    """A Device connected (CONNACK success) to `node`: round robin alternates, so try again
    until one lands there."""

    def landed() -> Device | None:
        d = Device(client_id, c.lb_port)
        holds_within(lambda: d.connacks or d.closed, 10.0)  # answered, or given up on
        if d.connacks and d.node(lb) == node:
            return d
        d.close()
        return None

    return wait_until(landed, 60, f"{client_id} connected to {node}", every_s=0.2)


@pytest.mark.timeout(180)
def test_client_id_taken_over_while_its_node_is_cut_off(part_mesh: Cluster) -> None:
    c, net = part_mesh, part_mesh.net
    lb = Balancer(c.folder / "haproxy.sock")
    devices: list[Device] = []
    try:
        old = connect_to("node-0", "takeover-x", c, lb)
        devices.append(old)
        net.block("node-0", [*NATS_HOSTS, "redis"], [NATS_PORT, REDIS_PORT])
        try:
            new = connect_to("node-1", "takeover-x", c, lb)
            devices.append(new)
            # One live connection per client id: the old one goes (told by node-0 itself,
            # as it cannot hear the takeover) before the partition heals.
            wait_until(lambda: old.node(lb) is None, 15.0, "node-0 letting go of X", 0.1)
        finally:
            net.unblock("node-0")
        mesh_back(c, lb)
        assert new.node(lb) == "node-1", "X lost its connection at node-1 after the heal"
        assert old.node(lb) is None
    finally:
        for d in devices:
            d.close()
