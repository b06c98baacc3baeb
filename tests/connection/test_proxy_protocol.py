"""The real client address behind a load balancer, on a whole connection node (in this
process, on the `core` services): PROXY protocol v1/v2 on TCP and TLS, trusted proxies'
X-Forwarded-For / Forwarded on WebSocket. What a user notices: the CONNACK, the address the
admin API (`starling clients`) reports, the per-address cap counting the real address and
saying which setting refused, and a connection without a header closed at once.
(Listener details under both event loops: test_proxy_listener.py; HAProxy: tests/e2e.)"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import aiohttp
import grpc
import pytest

from services.cli.ports import free_port
from services.common.mqtt import ConnAck, Connect, Decoder, encode
from services.common.proxy_protocol import V2_SIGNATURE
from services.connection.admission import PerAddress
from services.connection.config import ConnectionSettings
from services.connection.main import ConnectionService
from starling.session.v1 import session_pb2 as pb
from starling.session.v1 import session_pb2_grpc as pb_grpc
from tests.conftest import make_cert
from tests.connection.test_proxy_listener import ProxiedTls, v2_tcp4
from tests.e2e.clients import Raw
from tests.inproc import ADMIN_TOKEN, OPEN_TENANT, Core, serving
from tests.poll import eventually, wait_until

CAP = 1  # max_connections_per_ip of the node under test


@pytest.fixture(scope="module")
async def node(
    core: Core, nats_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[ConnectionService]:
    folder = tmp_path_factory.mktemp("proxied-node")
    cert, key = make_cert(folder)
    settings = ConnectionSettings(
        node_id="proxied",
        nats_url=nats_url,
        redis_url=redis_url,
        data_dir=folder,
        metrics_port=-1,
        mqtt_host="127.0.0.1",
        mqtt_port=0,
        tls_port=0,
        ws_port=free_port(),
        tls_cert_file=cert,
        tls_key_file=key,
        session_addr=core.session,
        router_addr=core.router,
        queue_addr=core.queue,
        metrics_addr=core.metrics,
        proxy_protocol=True,
        proxy_header_timeout_s=2.0,
        trusted_proxies=["127.0.0.2/32"],
        max_connections_per_ip=CAP,
    )
    service = ConnectionService(settings)
    async with serving(service):
        yield service


def client_id() -> str:
    return f"pp-{uuid.uuid4().hex[:10]}"


def connect_bytes(cid: str, level: int = 5) -> bytes:
    return encode(Connect(cid, level, username=f"{OPEN_TENANT}/u"), level)


def listed_peers(session_addr: str, *cids: str) -> dict[str, str]:
    """The address the admin API (what `starling clients` prints) shows per client id, once
    all of them are listed (blocking: run it in a thread)."""
    with grpc.insecure_channel(session_addr) as channel:
        stub = pb_grpc.SessionAdminServiceStub(channel)
        request = pb.ListClientsRequest(tenant=OPEN_TENANT)
        md = [("authorization", f"Bearer {ADMIN_TOKEN}")]

        def listed() -> dict[str, str] | None:
            held = {
                c.client_id: c.peer_address for c in stub.ListClients(request, metadata=md).clients
            }
            return {c: held[c] for c in cids} if all(c in held for c in cids) else None

        return wait_until(listed, what=f"{cids} listed")


async def peers(core: Core, *cids: str) -> dict[str, str]:
    return await asyncio.to_thread(listed_peers, core.session, *cids)


def raw_with(port: int, *writes: bytes, level: int = 5) -> Raw:
    """A raw MQTT client whose socket first sends `writes` (one segment each)."""
    client = Raw(port, level)
    client.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for data in writes:
        client.sock.sendall(data)
    return client


async def test_v1_header_and_connect_in_one_segment(node: ConnectionService, core: Core) -> None:
    cid = client_id()
    header = b"PROXY TCP4 203.0.113.10 10.0.0.1 4001 1883\r\n"
    client = await asyncio.to_thread(raw_with, node.ports["mqtt"], header + connect_bytes(cid))
    ack = await asyncio.to_thread(client.recv)
    assert isinstance(ack, ConnAck) and ack.reason_code == 0
    assert await peers(core, cid) == {cid: "203.0.113.10:4001"}
    client.close()


async def test_v2_ipv6_header_split_over_writes(node: ConnectionService, core: Core) -> None:
    cid = client_id()
    block = socket.inet_pton(socket.AF_INET6, "2001:db8::10") + bytes(16)
    block += struct.pack("!HH", 4002, 1883)
    header = V2_SIGNATURE + b"\x21\x21" + struct.pack("!H", len(block)) + block
    parts = [header[i : i + 7] for i in range(0, len(header), 7)]
    client = await asyncio.to_thread(raw_with, node.ports["mqtt"], *parts, connect_bytes(cid))
    ack = await asyncio.to_thread(client.recv)
    assert isinstance(ack, ConnAck) and ack.reason_code == 0
    assert await peers(core, cid) == {cid: "2001:db8::10:4002"}
    client.close()


async def test_tls_behind_send_proxy_v2(node: ConnectionService, core: Core) -> None:
    cid = client_id()
    cert = Path(node._s.data_dir) / "cert.pem"
    tls = await asyncio.to_thread(
        ProxiedTls, node.ports["mqtts"], v2_tcp4("192.0.2.30", 4003), cert
    )
    await asyncio.to_thread(tls.send, connect_bytes(cid))
    (ack,) = Decoder(5).feed(await asyncio.to_thread(tls.recv))
    assert isinstance(ack, ConnAck) and ack.reason_code == 0
    assert await peers(core, cid) == {cid: "192.0.2.30:4003"}
    tls.close()


async def test_without_a_valid_header_the_connection_is_closed(node: ConnectionService) -> None:
    assert node.node is not None
    before = node.node.refusals.get("proxy_protocol")
    for first in (connect_bytes(client_id()), b"PROXY TCP4 bogus\r\n" + connect_bytes("x")):
        client = await asyncio.to_thread(raw_with, node.ports["mqtt"], first)
        assert await asyncio.to_thread(client.closed)  # no CONNACK: closed
        assert client.pending == []
        client.close()
    await eventually(lambda: node.node.refusals.get("proxy_protocol") == before + 2)


async def test_the_cap_counts_the_headers_address_and_names_its_setting(
    node: ConnectionService, core: Core
) -> None:
    """Every socket comes from 127.0.0.1; the cap (1) applies per address the header names."""
    port = node.ports["mqtt"]
    first, second, other = client_id(), client_id(), client_id()
    header = b"PROXY TCP4 198.51.100.20 10.0.0.1 %d 1883\r\n"
    a = await asyncio.to_thread(raw_with, port, header % 5001 + connect_bytes(first))
    assert (await asyncio.to_thread(a.recv)).reason_code == 0  # type: ignore[attr-defined]
    b = await asyncio.to_thread(raw_with, port, header % 5002 + connect_bytes(second))
    refused = await asyncio.to_thread(b.recv)
    assert isinstance(refused, ConnAck) and refused.reason_code == 0x97
    why = refused.properties.reason_string or ""
    assert f"max_connections_per_ip={CAP}" in why and "load balancer" in why
    v3 = await asyncio.to_thread(raw_with, port, header % 5003 + connect_bytes(client_id(), 4))
    v3.level = 4
    v3.decoder = Decoder(4)
    # 3.1.1 has no Quota exceeded: return code 3, which the codec reads as 0x88.
    assert (await asyncio.to_thread(v3.recv)) == ConnAck(False, 0x88)
    c = await asyncio.to_thread(
        raw_with, port, b"PROXY TCP4 198.51.100.21 10.0.0.1 5004 1883\r\n" + connect_bytes(other)
    )
    assert (await asyncio.to_thread(c.recv)).reason_code == 0  # type: ignore[attr-defined]
    assert await peers(core, first, other) == {
        first: "198.51.100.20:5001",
        other: "198.51.100.21:5004",
    }
    for client in (a, b, v3, c):
        client.close()


@asynccontextmanager
async def ws_client(
    port: int, cid: str, source: str, headers: dict[str, str]
) -> AsyncIterator[int]:
    """An MQTT client over WebSocket from local address `source`, connected while inside;
    yields its CONNACK's reason code."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    url = f"http://127.0.0.1:{port}/mqtt"
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.ws_connect(url, protocols=("mqtt",), headers=headers) as ws,
    ):
        await ws.send_bytes(connect_bytes(cid))
        msg = await ws.receive(timeout=10)
        (ack,) = Decoder(5).feed(msg.data)
        assert isinstance(ack, ConnAck)
        yield ack.reason_code


async def test_websocket_trusts_forwarding_headers_only_from_trusted_proxies(
    node: ConnectionService, core: Core
) -> None:
    port = node.ports["ws"]
    via_proxy, forwarded, direct = client_id(), client_id(), client_id()
    xff = {"X-Forwarded-For": "6.6.6.6, 192.0.2.33, 127.0.0.2"}
    async with AsyncExitStack() as stack:
        codes = [
            await stack.enter_async_context(ws_client(port, via_proxy, "127.0.0.2", xff)),
            await stack.enter_async_context(
                ws_client(port, forwarded, "127.0.0.2", {"Forwarded": 'for="[2001:db8::33]:1"'})
            ),
            # 127.0.0.1 is no trusted proxy: its headers are the client's own words.
            await stack.enter_async_context(ws_client(port, direct, "127.0.0.1", xff)),
        ]
        assert codes == [0, 0, 0]
        assert await peers(core, via_proxy, forwarded, direct) == {
            via_proxy: "ws:192.0.2.33",
            forwarded: "ws:2001:db8::33",
            direct: "ws:127.0.0.1",
        }


def test_refusal_log_names_the_setting_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    per = PerAddress(1)
    for port in (1, 2, 3):
        per.opened(f"198.51.100.9:{port}")
    with caplog.at_level(logging.WARNING, logger="starling.connection.admission"):
        refused = [per.refusal("198.51.100.9:3", now) for now in (100.0, 101.0, 111.0)]
    assert all(r is not None and r.reason_code == 0x97 for r in refused)
    lines = [r for r in caplog.records if r.getMessage() == "connections_per_ip_refused"]
    assert [(r.address, r.refused, r.max_connections_per_ip) for r in lines] == [  # type: ignore[attr-defined]
        ("198.51.100.9", 1, 1),
        ("198.51.100.9", 2, 1),  # the one at 101 s is counted in the next line
    ]
    assert "max_connections_per_ip=1; raise it or set 0" in lines[0].why  # type: ignore[attr-defined]
    per.closed("198.51.100.9:3")
    per.closed("198.51.100.9:2")
    assert per.refusal("198.51.100.9:1", 112.0) is None  # back within the cap
