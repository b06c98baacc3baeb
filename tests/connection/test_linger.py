"""The lingering close of TCP sockets (services/connection/linger.py), on real sockets, on
asyncio's loop and on uvloop (the nodes' loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from services.connection.linger import Linger, TcpSink

LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}


class Server(asyncio.Protocol):
    """Drops what it reads; `bye` writes `data` and closes through the sink."""

    def __init__(self, linger: Linger, accepted: asyncio.Queue[Server]) -> None:
        self.linger, self.accepted = linger, accepted
        self.sink: TcpSink | None = None
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.sink = TcpSink(transport, self.linger)  # type: ignore[arg-type]
        self.accepted.put_nowait(self)

    def connection_lost(self, exc: Exception | None) -> None:
        assert self.sink is not None
        self.sink.lost()
        self.lost.set_result(None)

    def bye(self, data: bytes) -> None:
        assert self.sink is not None
        self.sink.write(data)
        self.sink.close()


async def _pair(
    linger: Linger,
) -> tuple[Server, asyncio.StreamReader, asyncio.StreamWriter, asyncio.Server]:
    accepted: asyncio.Queue[Server] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Server(linger, accepted), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return await asyncio.wait_for(accepted.get(), 5), reader, writer, server


async def _half_close_then_close_when_the_client_does() -> None:
    linger = Linger(timeout_s=30)
    srv, reader, writer, server = await _pair(linger)
    writer.write(b"x" * (1 << 20))  # input the server has not all read when it closes
    srv.bye(b"bye")
    assert linger.count == 1
    assert await asyncio.wait_for(reader.read(), 5) == b"bye"  # then end-of-file, no reset
    writer.write(b"still writing")  # the server reads on, and drops it
    await writer.drain()
    assert not srv.lost.done() and linger.count == 1
    writer.close()  # the client closes: so does the server, long before the timeout
    await asyncio.wait_for(srv.lost, 5)
    assert linger.count == 0
    server.close()


async def _aborted_at_the_timeout() -> None:
    linger = Linger(timeout_s=0.2)
    srv, _, writer, server = await _pair(linger)
    srv.bye(b"bye")
    await asyncio.wait_for(srv.lost, 5)  # the client never closed
    assert linger.count == 0
    writer.close()
    server.close()


async def _over_the_limit_closed_at_once() -> None:
    linger = Linger(timeout_s=30, max_sockets=1)
    first, _, w1, server = await _pair(linger)
    second, reader, w2, _ = await _pair(linger)
    first.bye(b"1")
    second.bye(b"2")  # one lingers already: this one is closed, not half-closed
    assert linger.count == 1
    await asyncio.wait_for(second.lost, 5)
    assert await asyncio.wait_for(reader.read(), 5) == b"2"
    assert not first.lost.done()
    for w in (w1, w2):
        w.close()
    await asyncio.wait_for(first.lost, 5)
    assert linger.count == 0
    server.close()


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize(
    "case",
    [
        _half_close_then_close_when_the_client_does,
        _aborted_at_the_timeout,
        _over_the_limit_closed_at_once,
    ],
)
def test_lingering_close(loop: str, case: Callable[[], Coroutine[Any, Any, None]]) -> None:
    LOOPS[loop](case())
