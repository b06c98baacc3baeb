"""TCP keep-alive on the sockets a listener accepts (services/connection/listener.py)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from services.connection.linger import Linger, TcpSink
from services.connection.listener import TcpKeepalive, start_tcp


class _Node:
    """What `MqttProtocol` needs of a node: it hands over each accepted transport."""

    def __init__(self) -> None:
        self.linger = Linger()
        self.accepted: asyncio.Future[asyncio.Transport] = (
            asyncio.get_running_loop().create_future()
        )

    def open(self, sink: TcpSink, peer: str, cert: object) -> object:
        self.accepted.set_result(sink._transport)
        return object()


async def _accepted_socket_options(keepalive: TcpKeepalive) -> dict[str, int]:
    """Accept one real TCP connection through the node's listener (`start_tcp`) and read the
    keep-alive options of the accepted socket."""
    node = _Node()
    server = await start_tcp(node, "127.0.0.1", 0, keepalive=keepalive)  # type: ignore[arg-type]
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        transport = await asyncio.wait_for(node.accepted, 5)
        sock = transport.get_extra_info("socket")
        opts = {
            "on": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
        }
        transport.abort()
        return opts
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


@pytest.mark.skipif(not hasattr(socket, "TCP_KEEPIDLE"), reason="Linux socket options")
async def test_accepted_sockets_get_tcp_keepalive() -> None:
    opts = await _accepted_socket_options(TcpKeepalive(idle_s=30, interval_s=5, count=3))
    assert opts == {"on": 1, "idle": 30, "interval": 5, "count": 3}


@pytest.mark.skipif(not hasattr(socket, "TCP_KEEPIDLE"), reason="Linux socket options")
async def test_idle_zero_leaves_tcp_keepalive_off() -> None:
    opts = await _accepted_socket_options(TcpKeepalive(idle_s=0))
    assert opts["on"] == 0


@pytest.mark.skipif(not hasattr(socket, "TCP_KEEPIDLE"), reason="Linux socket options")
def test_accepted_sockets_get_tcp_keepalive_on_uvloop() -> None:
    """The nodes run on uvloop, whose transports hand out a socket-like wrapper."""
    import uvloop

    opts = uvloop.run(_accepted_socket_options(TcpKeepalive(idle_s=45, interval_s=7, count=2)))
    assert opts == {"on": 1, "idle": 45, "interval": 7, "count": 2}
