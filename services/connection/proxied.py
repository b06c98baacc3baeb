"""TCP and TLS listeners behind a load balancer that sends the PROXY protocol
(`proxy_protocol`): each accepted socket must first deliver a PROXY header
(services/common/proxy_protocol.py), which names the client's real address; then the socket
becomes an ordinary connection of the node, opened under that address.

Why not an asyncio Server: its transport reads whatever arrived, and for TLS the header comes
before the handshake (HAProxy `send-proxy-v2` in TCP mode), so bytes of the ClientHello read
along with it could not be handed back to the TLS layer. Here the raw socket is read with
MSG_PEEK and exactly the header's bytes are taken; everything after it stays in the kernel,
and `loop.connect_accepted_socket` then builds the same transport (TLS or plain) and
protocol an asyncio Server would. After the header nothing differs from the other listeners:
no per-packet work is added.

A socket that sends no valid header within `timeout_s` (or sends more than the header may
have) is closed at once, logged (`proxy_header_refused`, with the socket's peer) and counted
(refusals, limit `proxy_protocol`). One that closes before sending a byte (a load balancer's
TCP health check) is neither.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.common.log_summary import LogSummary
from services.common.proxy_protocol import (
    V1_MAX_BYTES,
    V2_DEFAULT_MAX_BYTES,
    ProxyHeader,
    ProxyProtocolError,
    parse_proxy_header,
)
from services.common.refusals import UNKNOWN_TENANT
from services.common.tasks import TaskSet

log = logging.getLogger("starling.connection.proxied")
ACCEPT_BATCH = 64  # sockets accepted per readiness of a listening socket
ACCEPT_RETRY_S = 1.0  # out of file descriptors: accept again after this


@dataclass(frozen=True, slots=True)
class ProxyHeaderPolicy:
    timeout_s: float = 5.0
    max_v2_bytes: int = V2_DEFAULT_MAX_BYTES


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxiedServing:
    """What a ProxyListener needs: the protocol of a connection opened under a peer
    ("ip:port"), the TLS context (None: plain TCP), and where a refusal is counted."""

    protocol: Callable[[str], asyncio.Protocol]
    ssl_ctx: ssl.SSLContext | None
    policy: ProxyHeaderPolicy
    refused: Callable[[], None]


class _SilentCloseError(Exception):
    """The socket closed before sending a byte."""


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()
    loop.add_reader(fd, _wake, ready)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def read_proxy_header(sock: socket.socket, max_v2_bytes: int) -> ProxyHeader:
    """Take exactly the PROXY header's bytes from non-blocking `sock`: peek at what arrived;
    while the header is incomplete all of it is header, so take it; once complete take up
    to its end only. ProxyProtocolError: not a valid header; _SilentCloseError: closed at once."""
    loop = asyncio.get_running_loop()
    taken = b""
    limit = max(V1_MAX_BYTES, max_v2_bytes)
    while True:
        await _readable(loop, sock)
        try:
            peeked = sock.recv(max(1, limit - len(taken)), socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            continue
        if not peeked:
            if taken:
                raise ProxyProtocolError(f"closed after {len(taken)} bytes of a header")
            raise _SilentCloseError
        header = parse_proxy_header(taken + peeked, max_v2_bytes)
        want = len(peeked) if header is None else header.length - len(taken)
        while want > 0:  # those bytes are already in the socket's buffer
            chunk = sock.recv(want)
            if not chunk:
                raise ProxyProtocolError("closed inside its header")
            taken, want = taken + chunk, want - len(chunk)
        if header is not None:
            return header


def _peer(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else "?"


class ProxyListener:
    """Accepts on `sockets` (bound, listening, non-blocking) until `close()`: what an asyncio
    Server is to the listeners without the PROXY protocol (`sockets`, `close`)."""

    def __init__(self, *, sockets: list[socket.socket], serving: ProxiedServing) -> None:
        self.sockets = sockets
        self._serving = serving
        self._tasks = TaskSet()  # one per socket until its header is read
        self._closed = False
        self._refusal_log = LogSummary(log, "proxy_header_refused")
        self._loop = asyncio.get_running_loop()

    def start_serving(self) -> None:
        for lsock in self.sockets:
            self._loop.add_reader(lsock.fileno(), self._accept, lsock)

    def close(self) -> None:
        """Stop accepting (the connections open stay; those still owing their header are
        closed when it comes)."""
        if self._closed:
            return
        self._closed = True
        for lsock in self.sockets:
            self._loop.remove_reader(lsock.fileno())
            lsock.close()

    def _accept(self, lsock: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors or buffers: back off
                log.warning("accept_failed", extra={"error": str(exc)})
                self._loop.remove_reader(lsock.fileno())
                self._loop.call_later(ACCEPT_RETRY_S, self._resume, lsock)
                return
            sock.setblocking(False)
            self._tasks.spawn(self._open(sock, _peer(addr)), name="proxy-header")

    def _resume(self, lsock: socket.socket) -> None:
        if not self._closed:
            self._loop.add_reader(lsock.fileno(), self._accept, lsock)

    async def _open(self, sock: socket.socket, socket_peer: str) -> None:
        s = self._serving
        try:
            async with asyncio.timeout(s.policy.timeout_s):
                header = await read_proxy_header(sock, s.policy.max_v2_bytes)
        except (ProxyProtocolError, TimeoutError, OSError) as exc:
            sock.close()
            s.refused()
            why = str(exc) or "no PROXY header in time"
            self._refusal_log.add(UNKNOWN_TENANT, example=f"{socket_peer}: {why}")
            return
        except _SilentCloseError:
            sock.close()
            log.debug("proxy_header_absent", extra={"peer": socket_peer})
            return
        if self._closed:
            sock.close()
            return
        peer = str(header.source) if header.source is not None else socket_peer
        try:
            await self._loop.connect_accepted_socket(lambda: s.protocol(peer), sock, ssl=s.ssl_ctx)
        except (OSError, TimeoutError) as exc:  # a failed TLS handshake (SSLError: OSError)
            sock.close()
            log.debug("tls_handshake_failed", extra={"peer": peer, "error": str(exc)})


async def proxy_listener(
    host: str, port: int, reuse_port: bool, serving: ProxiedServing
) -> ProxyListener:
    """Bind `host`:`port` (each address it resolves to, as an asyncio Server does) and
    return the listener, not yet serving (`start_serving`)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, _type, _proto, _name, sockaddr in dict.fromkeys(infos):
            sock = socket.create_server(
                sockaddr, family=family, backlog=4096, reuse_port=reuse_port
            )
            sock.setblocking(False)
            sockets.append(sock)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return ProxyListener(sockets=sockets, serving=serving)
