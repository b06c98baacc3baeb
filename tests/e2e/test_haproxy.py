"""A node behind HAProxy, as docs/load-balancers.md configures it: TCP mode with
`send-proxy-v2` in front of a node with `proxy_protocol` on, and HTTP mode with
`option forwardfor` in front of its WebSocket listener with `trusted_proxies`. The node sees
every client's own address: the per-address cap (`max_connections_per_ip`) applies per
client address, not to HAProxy's, and `starling clients` shows those addresses.

Clients bind loopback source addresses (127.0.0.x), so each "host" has its own address.
HAProxy (Debian's /usr/sbin/haproxy) runs in the foreground on free ports."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from services.cli.launcher import Launcher, Mesh
from services.cli.ports import free_port, port_open
from services.common.mqtt import ConnAck, Connect, Decoder, encode
from tests.cli.in_process import starling_in_process
from tests.conftest import make_cert
from tests.e2e.clients import TIMEOUT, Paho
from tests.faults.checker import Checker
from tests.faults.load import Publisher, Subscriber
from tests.poll import holds_within, wait_until

HAPROXY = shutil.which("haproxy") or shutil.which("/usr/sbin/haproxy")
pytestmark = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed")

CAP = 50
PER_HOST = 60
HOSTS = ("127.0.0.2", "127.0.0.3")
TENANT = "lb"
QUOTA_EXCEEDED = 0x97


class Balanced:
    """A one-node mesh and the HAProxy in front of it (started, killed, started again)."""

    def __init__(self, mesh: Mesh, config: Path, cert: Path) -> None:
        self.mesh = mesh
        self.config = config
        self.cert = cert
        self.mqtt_port = free_port()  # HAProxy's TCP frontends: MQTT, MQTT over TLS
        self.tls_port = free_port()
        self.ws_port = free_port()  # HAProxy's HTTP frontend
        node = mesh.by_name("connection-0")
        ports = (self.mqtt_port, self.tls_port, self.ws_port)
        config.write_text(haproxy_config(ports, (node.port, node.tls_port, node.ws_port)))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert HAPROXY is not None
        self.proc = proc = subprocess.Popen(
            [HAPROXY, "-db", "-f", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def listening() -> bool:
            assert proc.poll() is None, f"haproxy exited with {proc.returncode}"
            ports = (self.mqtt_port, self.tls_port, self.ws_port)
            return all(port_open("127.0.0.1", p) for p in ports)

        wait_until(listening, 20, "haproxy listening")

    def kill(self) -> None:
        """SIGKILL: every connection through it ends at once."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


def haproxy_config(front: tuple[int, int, int], node: tuple[int, int, int]) -> str:
    """TCP (send-proxy-v2) for MQTT and MQTT over TLS (passed through: the node does TLS),
    HTTP (option forwardfor) for WebSocket."""
    return f"""
global
    maxconn 4096
defaults
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout tunnel 1h
frontend mqtt
    mode tcp
    bind 127.0.0.1:{front[0]}
    default_backend nodes
backend nodes
    mode tcp
    server node0 127.0.0.1:{node[0]} send-proxy-v2
frontend mqtts
    mode tcp
    bind 127.0.0.1:{front[1]}
    default_backend tls_nodes
backend tls_nodes
    mode tcp
    server node0 127.0.0.1:{node[1]} send-proxy-v2
frontend mqtt_ws
    mode http
    bind 127.0.0.1:{front[2]}
    option forwardfor
    default_backend ws_nodes
backend ws_nodes
    mode http
    server node0 127.0.0.1:{node[2]}
"""


@pytest.fixture(scope="module")
def balanced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Balanced]:
    folder: Path = tmp_path_factory.mktemp("haproxy")
    env = {
        "STARLING_PROXY_PROTOCOL": "true",
        "STARLING_MAX_CONNECTIONS_PER_IP": str(CAP),
        "STARLING_TRUSTED_PROXIES": '["127.0.0.1/32"]',  # HAProxy's address towards the node
        "STARLING_LOG_LEVEL": "WARNING",
    }
    cert, key = make_cert(folder)
    launcher = Launcher(
        data_dir=folder / "run",
        nodes=1,
        mqtt_port=0,
        anonymous=True,
        extra_env=env,
        tls=(cert, key),
    )
    mesh = launcher.start(timeout_s=60)
    balanced = Balanced(mesh, folder / "haproxy.cfg", cert)
    try:
        balanced.start()
        yield balanced
    finally:
        balanced.kill()
        launcher.stop()


def mqtt_connect(port: int, source: str, client_id: str) -> tuple[socket.socket, ConnAck]:
    """A raw MQTT 5 client from `source` through HAProxy; its socket and CONNACK."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    sock.sendall(encode(Connect(client_id, 5, username=f"{TENANT}/u"), 5))
    decoder = Decoder(5)
    while True:
        data = sock.recv(4096)
        if not data:
            raise ConnectionError(f"{client_id}: closed without CONNACK")
        packets = decoder.feed(data)
        if packets:
            ack = packets[0]
            assert isinstance(ack, ConnAck)
            return sock, ack


def starling_clients(mesh: Mesh) -> list[dict[str, str]]:
    out = starling_in_process(  # tests/cli/in_process.py
        "clients",
        "--tenant",
        TENANT,
        "--data-dir",
        mesh.data_dir,
        env={"STARLING_ADMIN_TOKEN": None},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    clients: list[dict[str, str]] = json.loads(out.stdout)["clients"]
    return clients


def test_per_address_cap_applies_to_each_client_address_behind_haproxy(
    balanced: Balanced,
) -> None:
    held: list[socket.socket] = []
    outcomes: dict[str, list[int]] = {host: [] for host in HOSTS}
    reasons: set[str] = set()
    try:
        for i in range(PER_HOST):
            for host in HOSTS:
                sock, ack = mqtt_connect(balanced.mqtt_port, host, f"lb-{host}-{i}")
                outcomes[host].append(ack.reason_code)
                if ack.reason_code == 0:
                    held.append(sock)
                else:
                    reasons.add(ack.properties.reason_string or "")
                    sock.close()
        for host in HOSTS:
            assert outcomes[host].count(0) == CAP, outcomes[host]
            assert outcomes[host].count(QUOTA_EXCEEDED) == PER_HOST - CAP
        assert reasons == {
            f"too many connections from this address (max_connections_per_ip={CAP}; "
            "raise it or set 0 behind a load balancer)"
        }
        listed = starling_clients(balanced.mesh)
        by_host = {host: 0 for host in HOSTS}
        for client in listed:
            address = client["peer_address"].rpartition(":")[0]
            assert client["client_id"].startswith(f"lb-{address}-")
            by_host[address] += 1
        assert by_host == {host: CAP for host in HOSTS}
    finally:
        for sock in held:
            sock.close()


def test_tls_passed_through_haproxy_with_send_proxy_v2(balanced: Balanced) -> None:
    """The header comes before the TLS handshake; the node reads it, then does TLS."""
    client = Paho(
        balanced.tls_port, "tls-via-lb", username=f"{TENANT}/u", tls_ca=str(balanced.cert)
    )
    client.c.connect("127.0.0.1", balanced.tls_port, bind_address="127.0.0.6")
    client.c.loop_start()
    assert not client.connacks.get(timeout=TIMEOUT).is_failure
    try:
        peers = {c["client_id"]: c["peer_address"] for c in starling_clients(balanced.mesh)}
        assert peers["tls-via-lb"].rpartition(":")[0] == "127.0.0.6"
    finally:
        client.close()


@asynccontextmanager
async def ws_client(
    port: int, source: str, client_id: str, headers: dict[str, str]
) -> AsyncIterator[int]:
    """An MQTT client over WebSocket from `source`, connected while inside; yields its
    CONNACK's reason code."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    url = f"http://127.0.0.1:{port}/mqtt"
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.ws_connect(url, protocols=("mqtt",), headers=headers) as ws,
    ):
        await ws.send_bytes(encode(Connect(client_id, 5, username=f"{TENANT}/u"), 5))
        msg = await ws.receive(timeout=10)
        (ack,) = Decoder(5).feed(msg.data)
        assert isinstance(ack, ConnAck)
        yield ack.reason_code


async def test_websocket_behind_haproxy_takes_the_forwarded_address(balanced: Balanced) -> None:
    node_ws = balanced.mesh.by_name("connection-0").ws_port
    spoof = {"X-Forwarded-For": "6.6.6.6"}
    async with AsyncExitStack() as stack:
        # Through HAProxy (trusted): it appends the client's own address to the spoofed one.
        via_lb = ws_client(balanced.ws_port, "127.0.0.4", "ws-via-lb", spoof)
        assert await stack.enter_async_context(via_lb) == 0
        # Straight to the node from an address it does not trust: the header is ignored.
        direct = ws_client(node_ws, "127.0.0.5", "ws-direct", spoof)
        assert await stack.enter_async_context(direct) == 0
        # A CONNACK is sent once the session service holds the client: listed now.
        listed = await asyncio.to_thread(starling_clients, balanced.mesh)
        peers = {c["client_id"]: c["peer_address"] for c in listed}
        assert peers["ws-via-lb"] == "ws:127.0.0.4"
        assert peers["ws-direct"] == "ws:127.0.0.5"


def test_haproxy_killed_while_messages_flow_loses_nothing_acknowledged(
    balanced: Balanced,
) -> None:
    """Publishers and subscribers all go through HAProxy to the proxied node; HAProxy is
    SIGKILLed mid-stream and started again. Every client reconnects through it (each new
    connection a new PROXY header), and the checker counts: nothing acknowledged is lost to
    the persistent session, no QoS 2 message arrives twice, every publish is acknowledged."""
    checker = Checker()
    base = f"lb/{uuid.uuid4().hex[:8]}"
    ports = lambda: [balanced.mqtt_port]  # noqa: E731  (the one door: HAProxy)
    subscribers = [
        Subscriber("persistent", ports, 0, True, f"{base}/#", checker),
        Subscriber("clean", ports, 0, False, f"{base}/#", checker),
    ]
    publishers = [
        Publisher("q1", ports, 0, 1, f"{base}/a", checker, rate=100),
        Publisher("q2", ports, 0, 2, f"{base}/b", checker, rate=100),
    ]
    clients = [*subscribers, *publishers]
    try:
        for c in clients:
            c.start()
        assert holds_within(lambda: checker.delivered_count("persistent") >= 100, 20)
        balanced.kill()
        balanced.start()
        connects = {c.name: c.connects for c in clients}
        assert holds_within(lambda: all(c.connects > 1 for c in clients), 30), connects
        assert holds_within(lambda: checker.delivered_count("persistent") >= 300, 30)
        for p in publishers:
            p.pause()
        assert holds_within(lambda: all(p.unacked() == 0 for p in publishers), 30)
        assert holds_within(lambda: checker.missing("persistent") == 0, 30)
    finally:
        for c in clients:
            c.stop()
    verdict = checker.verdict()
    print(f"haproxy killed: {verdict.summary()}")
    verdict.check(clean_may_lose=True)  # a clean session misses what came while it was away
    assert verdict.acked > 0
    # A PUBREL the node no longer knew (PUBCOMP 0x92: its QoS 2 state of the cut connection
    # was not kept) is refused, not lost: the node had taken the message with PUBREC, and
    # the persistent session got it exactly once.
    for p in publishers:
        for kind, code, seq in p.refusals:
            assert (kind, code) == ("PubComp", 0x92), p.refusals
            assert checker.delivered_count_of("persistent", (p.name, seq)) == 1
