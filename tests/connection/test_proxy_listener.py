"""The PROXY protocol listeners (services/connection/proxied.py via `start_tcp(proxy=...)`)
on real sockets, under asyncio's loop and uvloop (what the node runs): the connection opens
under the header's address, the bytes after the header reach it unchanged (same segment,
split header, TLS whose ClientHello rides with the header), and a socket without a valid
header is closed and counted. The node here only records what the listener hands it; the
whole node is in test_proxy_protocol.py."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import uvloop

from services.common.proxy_protocol import V2_SIGNATURE
from services.common.refusals import Refusals
from services.connection.linger import Linger, TcpSink
from services.connection.listener import TcpKeepalive, server_ssl_context, start_tcp
from services.connection.proxied import ProxyHeaderPolicy
from tests.conftest import make_cert
from tests.poll import eventually, holds_within_async

PAYLOAD = bytes.fromhex("101000044d5154540502003c000000") + b"\x00\x01c" + b"\xc0\x00" * 50


def v2_tcp4(src: str, sport: int) -> bytes:
    block = socket.inet_aton(src) + socket.inet_aton("10.0.0.1") + struct.pack("!HH", sport, 1883)
    return V2_SIGNATURE + b"\x21\x11" + struct.pack("!H", len(block)) + block


class ProxiedTls:
    """A TLS client driven through memory BIOs over a plain socket, so that the PROXY header
    and the ClientHello leave in one segment (the hard case for a listener)."""

    def __init__(self, port: int, header: bytes, cafile: Path) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        ctx = ssl.create_default_context(cafile=str(cafile))
        self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.inc, self.out, server_hostname="localhost")
        pending = header
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.sock.sendall(pending + self.out.read())
                pending = b""
                self._read_more()
        self.sock.sendall(self.out.read())  # the client's Finished

    def _read_more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed by server")
        self.inc.write(data)

    def send(self, data: bytes) -> None:
        self.tls.write(data)
        self.sock.sendall(self.out.read())

    def recv(self) -> bytes:
        while True:
            try:
                return self.tls.read(65536)
            except ssl.SSLWantReadError:
                self._read_more()

    def close(self) -> None:
        self.sock.close()


class _Conn:
    def __init__(self) -> None:
        self.data = bytearray()

    def receive(self, data: bytes) -> None:
        self.data += data

    def lost(self) -> None:
        pass

    def writable(self, ok: bool) -> None:
        pass


class _Node:
    """What the listener needs of a node: `open` (recorded), `linger`, `refusals`."""

    def __init__(self) -> None:
        self.linger = Linger()
        self.refusals = Refusals()
        self.opened: list[tuple[str, _Conn]] = []

    def open(self, sink: TcpSink, peer: str, cert: object) -> _Conn:
        conn = _Conn()
        self.opened.append((peer, conn))
        return conn


Scenario = Callable[[_Node, int], Awaitable[None]]


def _run(scenario: Scenario, loop: str, tls: Path | None = None, timeout_s: float = 5.0) -> None:
    async def main() -> None:
        node = _Node()
        ctx = server_ssl_context(tls / "cert.pem", tls / "key.pem", None, False) if tls else None
        policy = ProxyHeaderPolicy(timeout_s=timeout_s)
        server = await start_tcp(
            node,  # type: ignore[arg-type]
            "127.0.0.1",
            0,
            ctx,
            TcpKeepalive(),
            proxy=policy,
        )
        try:
            await scenario(node, server.sockets[0].getsockname()[1])
        finally:
            server.close()

    (uvloop.run if loop == "uvloop" else asyncio.run)(main())


LOOPS = pytest.mark.parametrize("loop", ["asyncio", "uvloop"])


async def _opened(node: _Node, n: int = 1) -> list[tuple[str, bytes]]:
    await eventually(lambda: len(node.opened) >= n and len(node.opened[-1][1].data) >= len(PAYLOAD))
    return [(peer, bytes(conn.data)) for peer, conn in node.opened]


@LOOPS
def test_header_and_mqtt_in_one_segment(loop: str) -> None:
    async def scenario(node: _Node, port: int) -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"PROXY TCP4 203.0.113.1 10.0.0.1 40000 1883\r\n" + PAYLOAD)
        assert await _opened(node) == [("203.0.113.1:40000", PAYLOAD)]
        writer.close()

    _run(scenario, loop)


@LOOPS
def test_header_split_over_writes(loop: str) -> None:
    async def scenario(node: _Node, port: int) -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        header = v2_tcp4("198.51.100.7", 5555)
        for i in range(0, len(header) - 1, 5):  # TCP_NODELAY: each write its own segment
            writer.write(header[i : min(i + 5, len(header) - 1)])
            await writer.drain()
            await asyncio.sleep(0.01)
        # One byte of the header to go: nothing opens.
        assert not await holds_within_async(lambda: node.opened != [], 0.05)
        writer.write(header[-1:])
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(PAYLOAD)
        assert await _opened(node) == [("198.51.100.7:5555", PAYLOAD)]
        writer.close()

    _run(scenario, loop)


@LOOPS
def test_tls_after_the_header_in_the_same_segment(loop: str, tmp_path: Path) -> None:
    make_cert(tmp_path)

    async def scenario(node: _Node, port: int) -> None:
        header = v2_tcp4("192.0.2.44", 6000)
        client = await asyncio.to_thread(ProxiedTls, port, header, tmp_path / "cert.pem")
        await asyncio.to_thread(client.send, PAYLOAD)
        assert await _opened(node) == [("192.0.2.44:6000", PAYLOAD)]
        client.close()

    _run(scenario, loop, tls=tmp_path)


def _closed_by_server(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


@LOOPS
def test_no_header_or_garbled_header_is_closed_and_counted(loop: str) -> None:
    async def scenario(node: _Node, port: int) -> None:
        for first in (PAYLOAD, b"PROXY TCP4 1.2.3.4 1.2.3.999 1 2\r\n" + PAYLOAD):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(first)
            assert await asyncio.to_thread(_closed_by_server, sock)
            sock.close()
        assert node.opened == []
        assert node.refusals.get("proxy_protocol") == 2

    _run(scenario, loop)


@LOOPS
def test_header_not_complete_in_time_is_closed(loop: str) -> None:
    async def scenario(node: _Node, port: int) -> None:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"PROXY TCP4 ")
        # Closed by the node's 0.5 s timeout (the test's own read gives up after 10 s).
        assert await asyncio.to_thread(_closed_by_server, sock)
        sock.close()
        assert node.opened == [] and node.refusals.get("proxy_protocol") == 1

    _run(scenario, loop, timeout_s=0.5)
