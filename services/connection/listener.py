"""Listeners: TCP and TLS through an asyncio Protocol, WebSocket and WSS through aiohttp.
This is the only code of the node that touches sockets; all four feed the same Channel.

With `reuse_port` every listener binds with SO_REUSEPORT, so several node processes (the
workers of `starling up --node-workers N`) listen on the same ports and the kernel spreads
incoming connections among them.

Every accepted socket gets TCP keep-alive (`TcpKeepalive`), so a peer that vanished without
a FIN is found even when its MQTT keep alive is off or long. The TCP/TLS listeners arm it on
their listening sockets, whose options accepted sockets inherit (Linux, the BSDs): four
setsockopt calls and a socket object per accept were ~4% of a node's CPU per CONNECT.
A WebSocket message may be at most one maximal MQTT packet: aiohttp refuses a larger frame
from its header, before buffering it, and closes with 1009 (Message Too Big).

The peer a connection opens under is the client's real address when a proxy names it: the
PROXY protocol header on TCP/TLS (`proxy_protocol`, proxied.py), a trusted proxy's
`Forwarded`/`X-Forwarded-For` on WebSocket (`trusted_proxies`, services/common/forwarded.py).
Everything keyed on an address (the per-address cap, bans, flapping, ACLs, `starling
clients`, events) takes it from there.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import WebSocketError, WSCloseCode, WSMsgType, web

from services.common.forwarded import TrustedProxies, client_address, split_x_forwarded_for
from services.connection.conn import Conn
from services.connection.linger import Linger, TcpSink
from services.connection.node import Node
from services.connection.peer_cert import peer_cert
from services.connection.proxied import (
    ProxiedServing,
    ProxyHeaderPolicy,
    ProxyListener,
    proxy_listener,
)

log = logging.getLogger("starling.connection.listener")
WS_SUBPROTOCOLS = ("mqtt", "mqttv3.1")
NO_TRUSTED_PROXIES = TrustedProxies()  # WebSocket peers as the socket says


@dataclass(frozen=True, slots=True)
class TcpKeepalive:
    """TCP keep-alive of accepted sockets: first probe after `idle_s` of silence, then every
    `interval_s`; `count` unanswered probes close the socket. `idle_s` 0: off."""

    idle_s: int = 60
    interval_s: int = 15
    count: int = 4

    def apply(self, sock: Any) -> None:
        """Arm it on `sock` (a socket or the transport's socket-like wrapper; None: skip)."""
        if sock is None or not self.idle_s:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            # Linux names; elsewhere the system's own timings apply.
            for name, value in (
                ("TCP_KEEPIDLE", self.idle_s),
                ("TCP_KEEPINTVL", self.interval_s),
                ("TCP_KEEPCNT", self.count),
            ):
                opt = getattr(socket, name, None)
                if opt is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, opt, value)
        except OSError as exc:  # not a TCP socket (tests over a pipe), or already gone
            log.debug("tcp_keepalive_not_set", extra={"error": str(exc)})


class MqttProtocol(asyncio.Protocol):
    """One TCP/TLS connection. Write back-pressure marks the channel congested (QoS 0 drops).
    The node closes it through `TcpSink.close`, a lingering close (linger.py). `peer`: the
    client's address when a PROXY header named it; empty: the socket's peer."""

    __slots__ = ("conn", "node", "peer", "sink")

    def __init__(self, node: Node, peer: str = "") -> None:
        self.node = node
        self.peer = peer
        self.conn: Conn | None = None
        self.sink: TcpSink | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tcp: asyncio.Transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        tcp.set_write_buffer_limits(high=1 << 20)
        peer = self.peer
        if not peer:
            name = tcp.get_extra_info("peername")
            peer = f"{name[0]}:{name[1]}" if name else "?"
        cert = peer_cert(tcp.get_extra_info("peercert"))  # TLS: verified by the handshake
        self.sink = sink = TcpSink(tcp, self.node.linger)
        self.conn = self.node.open(sink, peer, cert)

    def data_received(self, data: bytes) -> None:
        assert self.conn is not None
        self.conn.receive(data)  # once closed, the channel drops it: the socket lingers

    def connection_lost(self, exc: Exception | None) -> None:
        if self.sink is not None:
            self.sink.lost()
        if self.conn is not None:
            self.conn.lost()

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.writable(False)

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.writable(True)


def server_ssl_context(
    cert: Path, key: Path, ca: Path | None, require_client_cert: bool
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(cert), str(key))
    if ca is not None:
        ctx.load_verify_locations(str(ca))
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return ctx


async def start_tcp(
    node: Node,
    host: str,
    port: int,
    ssl_ctx: ssl.SSLContext | None = None,
    keepalive: TcpKeepalive = TcpKeepalive(),
    reuse_port: bool = False,
    proxy: ProxyHeaderPolicy | None = None,
) -> asyncio.Server | ProxyListener:
    """The TCP (or, with `ssl_ctx`, TLS) listener; with `proxy`, one that expects a PROXY
    protocol header first on every connection (proxied.py)."""
    if proxy is not None:
        return await _start_proxied(node, host, port, ssl_ctx, keepalive, reuse_port, proxy)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: MqttProtocol(node),
        host,
        port,
        ssl=ssl_ctx,
        backlog=4096,
        reuse_address=True,
        reuse_port=reuse_port,
        start_serving=False,
    )
    for sock in server.sockets:  # before the first accept: every accepted socket inherits it
        keepalive.apply(sock)
    await server.start_serving()
    return server


async def _start_proxied(
    node: Node,
    host: str,
    port: int,
    ssl_ctx: ssl.SSLContext | None,
    keepalive: TcpKeepalive,
    reuse_port: bool,
    policy: ProxyHeaderPolicy,
) -> ProxyListener:
    serving = ProxiedServing(
        protocol=lambda peer: MqttProtocol(node, peer),
        ssl_ctx=ssl_ctx,
        policy=policy,
        refused=lambda: node.refusals.count("proxy_protocol"),
    )
    listener = await proxy_listener(host, port, reuse_port, serving)
    for sock in listener.sockets:  # accepted sockets inherit it
        keepalive.apply(sock)
    listener.start_serving()
    return listener


# A WebSocket's unsent bytes: over HIGH the connection is congested (as a TCP transport over
# its high-water mark), under LOW it may be written again.
WS_HIGH_BYTES = 256 << 10
WS_LOW_BYTES = 64 << 10


class _WsSink:
    """Queues MQTT bytes for one WebSocket; one writer task sends them in order. The queued
    bytes are counted, so a client that stops reading congests its connection instead of
    growing this queue."""

    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.queued_bytes = 0
        self.conn: Conn | None = None
        self._congested = False

    def write(self, data: bytes) -> None:
        self.queue.put_nowait(data)
        self.queued_bytes += len(data)
        if not self._congested and self.queued_bytes > WS_HIGH_BYTES and self.conn is not None:
            self._congested = True
            self.conn.writable(False)

    def _sent(self, n: int) -> None:
        self.queued_bytes -= n
        if self._congested and self.queued_bytes < WS_LOW_BYTES and self.conn is not None:
            self._congested = False
            self.conn.writable(True)

    def close(self) -> None:
        self.queue.put_nowait(None)

    async def run(self) -> None:
        """Send the queued bytes in order until the node closes the connection (the handler
        then sends the close frame, after them) or the WebSocket fails."""
        while True:
            data = await self.queue.get()
            if data is None:
                return
            try:
                await self.ws.send_bytes(data)
            except (ConnectionError, RuntimeError):
                return
            self._sent(len(data))


async def _read(ws: web.WebSocketResponse, conn: Conn, node: Node) -> int:
    """Hand the client's frames to its connection until the client closes or breaks a rule;
    the WebSocket close code the node's close frame should carry."""
    async for msg in ws:
        if msg.type is WSMsgType.BINARY:
            conn.receive(msg.data)
        elif msg.type is WSMsgType.TEXT:
            # MQTT over WebSocket must use binary frames [MQTT-6.0.0-1]: the MQTT DISCONNECT
            # says so to the client, the close frame to the WebSocket layer (1003, data of a
            # type the endpoint does not accept).
            node.carry_out(conn, conn.channel.disconnect(0x81, "text frame"))
            return int(WSCloseCode.UNSUPPORTED_DATA)
        elif msg.type is WSMsgType.ERROR:
            err = msg.data
            if isinstance(err, WebSocketError) and err.code == WSCloseCode.MESSAGE_TOO_BIG:
                # aiohttp sent 1009; the tenant once the client is known, as over TCP.
                node.refusals.count("max_packet_size_bytes", conn.channel.tenant)
            break
    return int(WSCloseCode.OK)


async def _close_ws(
    ws: web.WebSocketResponse,
    request: web.Request,
    reading: asyncio.Task[int],
    writing: asyncio.Task[None],
    linger: Linger,
) -> None:
    """The lingering close of a WebSocket (linger.py), at most `linger.timeout_s` in all:
    the node's last MQTT bytes go out while the client's frames are still read (and dropped:
    the channel is closed), then the close frame, then frames are dropped until the
    client's close frame. `ws.close()` reads those itself, but closes the TCP transport at
    once (unread input: a reset) when another task is receiving: so reading stops first.
    Past the time, or with too many lingering, the transport is aborted."""
    lingering = linger.begin()
    closed = False  # the close handshake ended (or the client had closed first)
    try:
        if lingering:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + linger.timeout_s
            await asyncio.wait((writing,), timeout=linger.timeout_s)
            code = (
                reading.result()
                if reading.done() and not reading.cancelled() and reading.exception() is None
                else int(WSCloseCode.OK)
            )
            reading.cancel()
            await asyncio.wait((reading,))
            remaining = deadline - loop.time()
            if writing.done() and remaining > 0:
                try:
                    await asyncio.wait_for(ws.close(code=code), timeout=remaining)
                    closed = True
                except TimeoutError:
                    pass
    finally:
        writing.cancel()
        reading.cancel()
        if lingering:
            linger.end()
        if not closed and request.transport is not None:
            # No waiting for a flush a client that does not read would hold up.
            request.transport.abort()


def ws_peer(request: web.Request, trusted: TrustedProxies) -> str:
    """The client's address: the socket's peer, or what trusted proxies say (forwarded.py)."""
    peer = request.remote or "?"
    if not trusted:
        return peer
    forwarded_for = [element.get("for") for element in request.forwarded]
    x_forwarded_for = split_x_forwarded_for(request.headers.getall("X-Forwarded-For", ()))
    return client_address(peer, trusted, forwarded_for, x_forwarded_for)


def ws_app(
    node: Node,
    path: str,
    keepalive: TcpKeepalive = TcpKeepalive(),
    trusted: TrustedProxies = NO_TRUSTED_PROXIES,
) -> web.Application:
    # aiohttp refuses a message of max_msg_size bytes or more: one maximal packet still fits.
    max_msg_size = node.config.max_packet_size_bytes + 1
    linger = node.linger

    async def handler(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(
            protocols=WS_SUBPROTOCOLS,
            max_msg_size=max_msg_size,
            autoping=True,
            timeout=linger.timeout_s,  # waiting for the client's close frame
        )
        if request.transport is not None:
            keepalive.apply(request.transport.get_extra_info("socket"))
        await ws.prepare(request)
        sink = _WsSink(ws)
        peer = ws_peer(request, trusted)
        transport = request.transport
        cert = peer_cert(transport.get_extra_info("peercert")) if transport else None
        conn = sink.conn = node.open(sink, f"ws:{peer}", cert)
        reading = asyncio.create_task(_read(ws, conn, node))
        writing = asyncio.create_task(sink.run())
        try:
            # Until the client goes (reading ends) or the node closes it (writing ends).
            await asyncio.wait((reading, writing), return_when=asyncio.FIRST_COMPLETED)
        finally:
            conn.lost()  # nothing more when the node closed it
            sink.close()
            await _close_ws(ws, request, reading, writing, linger)
        return ws

    app = web.Application()
    app.router.add_get(path, handler)
    return app


async def start_ws(
    node: Node,
    host: str,
    port: int,
    path: str,
    ssl_ctx: ssl.SSLContext | None = None,
    keepalive: TcpKeepalive = TcpKeepalive(),
    reuse_port: bool = False,
    trusted: TrustedProxies = NO_TRUSTED_PROXIES,
) -> web.AppRunner:
    app = ws_app(node, path, keepalive, trusted)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(
        runner,
        host,
        port,
        ssl_context=ssl_ctx,
        reuse_address=True,
        reuse_port=reuse_port,
    )
    await site.start()
    return runner
