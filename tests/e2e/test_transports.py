"""TLS, WebSocket and WSS listeners, and interoperability with the Mosquitto clients."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from tests.conftest import MeshInfo
from tests.e2e.clients import Paho


def _roundtrip(mesh: MeshInfo, sub: Paho, topic: str) -> None:
    sub.connect()
    sub.subscribe(topic, 1)
    pub = Paho(mesh.node(0))
    pub.connect()
    pub.publish(topic, "over-the-wire", 1)
    assert sub.expect(1)[0].payload == b"over-the-wire"
    sub.close()
    pub.close()


def test_tls_client(mesh: MeshInfo) -> None:
    port = mesh.mesh.by_name("connection-1").tls_port
    _roundtrip(mesh, Paho(port, tls_ca=str(mesh.cert)), "tr/tls")


@pytest.mark.parametrize("v5", [True, False])
def test_websocket_client(mesh: MeshInfo, v5: bool) -> None:
    port = mesh.mesh.by_name("connection-1").ws_port
    _roundtrip(mesh, Paho(port, v5=v5, transport="websockets"), f"tr/ws/{v5}")


def test_secure_websocket_client(mesh: MeshInfo) -> None:
    port = mesh.mesh.by_name("connection-0").wss_port
    _roundtrip(mesh, Paho(port, transport="websockets", tls_ca=str(mesh.cert)), "tr/wss")


@pytest.mark.skipif(shutil.which("mosquitto_sub") is None, reason="mosquitto-clients not installed")
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5", "mqttv31"])
def test_mosquitto_clients_interoperate(mesh: MeshInfo, version: str) -> None:
    topic = f"mosq/{version}"
    sub = subprocess.Popen(
        [
            "mosquitto_sub",
            "-h",
            "127.0.0.1",
            "-p",
            str(mesh.node(1)),
            "-t",
            topic,
            "-q",
            "1",
            "-C",
            "2",
            "-V",
            version,
            "-W",
            "15",
            "-i",
            f"msub-{version}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.7)  # mosquitto_sub has no "subscribed" signal
    for payload in ("one", "two"):
        subprocess.run(
            [
                "mosquitto_pub",
                "-h",
                "127.0.0.1",
                "-p",
                str(mesh.node(0)),
                "-t",
                topic,
                "-m",
                payload,
                "-q",
                "1",
                "-V",
                version,
            ],
            check=True,
            timeout=15,
        )
    out, err = sub.communicate(timeout=20)
    assert out.split() == ["one", "two"], err
