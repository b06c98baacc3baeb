"""The queue link, its wire format and the queue's end (the node's end:
services/queue/link_client.py): a TCP connection from a connection node straight to a queue
instance, for the calls of the persistent path (appends, reads, acks, released marks) and
the notices that push new entries to the node's readers.

Why: on these machines a NATS request round trip between two uvloop processes takes p50
0.33 ms, p99 0.47 ms (300-byte messages, 1,000 a second), and the same exchange on a TCP
connection p50 0.06 ms, p99 0.12 ms: nats-server is one more process to wake per hop, and
nats-py's request machinery costs more CPU than the call it carries. A persistent publish
crosses three such hops before its subscriber has it (append, its reply, the notice).

What does not change: the requests and replies are the same protobuf messages, served by the
same servicer methods as over NATS and gRPC. NATS stays the way for every call the link does
not take: no link announced by the instance, a link not open yet (it opens in the background
at the first call; one that cannot be opened is tried again after RETRY_S), a traced call
(its span context travels in NATS headers), a request larger than a frame. A call whose link
breaks under it, or that gets no reply in time (the link is then closed: a silently cut
connection must not hold every later call for a timeout), is sent again over NATS at once:
every call the link carries may be repeated (appends are idempotent per message id; reads,
acks and released marks may repeat). A notice the queue cannot put on a link goes on NATS.

Frames: length (4 bytes, big-endian, of what follows) | kind (1) | call id (4) | body.
  HELLO   node -> queue, first: body = the mesh secret (compared in constant time; nothing
          is checked when mesh_auth is disabled).
  CALL    body = method (1 byte, METHODS) + the request.
  REPLY   body = the reply.    ERROR  body = "<gRPC status name> <details>" (TOO_LARGE:
          the reply does not fit a frame; the caller asks again over gRPC).
  NOTICE  queue -> node, call id 0: body = a QueueNotice carrying pushed entries.
Bounds, at the queue: at most MAX_LINKS links; HELLO within HELLO_TIMEOUT_S and at most
HELLO_MAX_BYTES; frames of at most `max_frame` bytes; at most MAX_IN_FLIGHT calls per link
served at once, and none while its unsent replies exceed WRITE_BUFFER_HIGH (the link is not
read meanwhile, so the node's writes wait in TCP); notices not written to a link with more
than NOTICE_BUFFER_MAX bytes unsent (they go on NATS). A link that sends anything but HELLO
first, a wrong secret, an unknown kind or an oversized frame is closed. TCP keep-alive on
both ends finds a peer that vanished without a word.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import socket
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import cast

import grpc

from services.common.bus.unary import TOO_LARGE
from services.common.rpc import red
from services.common.rpc.errors import status_for
from services.common.tasks import TaskSet

log = logging.getLogger("starling.queue.link")

HELLO, CALL, REPLY, ERROR, NOTICE = 1, 2, 3, 4, 5
_HEAD = struct.Struct(">IBI")  # length of what follows, kind, call id
HEADER_BYTES = _HEAD.size
# Method codes of CALL frames, by the NATS subject the same call uses: the calls a connection
# node's NATS user may make. An append not checked against a route table's version
# (svc.queue.append, the router's) is not among them, as nodes may not publish there.
METHODS = {
    "svc.queue.direct": 2,
    "svc.queue.read": 3,
    "svc.queue.ack": 4,
    "svc.queue.released": 5,
}
MAX_LINKS = 4096  # nodes (and node workers) per queue instance
MAX_IN_FLIGHT = 256
HELLO_TIMEOUT_S = 5.0
HELLO_MAX_BYTES = 1024
WRITE_BUFFER_HIGH = 8 << 20
NOTICE_BUFFER_MAX = 4 << 20

Handler = Callable[[bytes], Awaitable[bytes]]


def tune(transport: asyncio.BaseTransport) -> None:
    """Small frames go out at once (with Nagle's algorithm a frame written while an earlier
    one is unacknowledged waits for the peer's delayed ACK, up to 40 ms), and a peer gone
    without a FIN or RST is found in about 25 s instead of the kernel's two hours."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def frame(kind: int, call_id: int, body: bytes) -> bytes:
    return _HEAD.pack(len(body) + 5, kind, call_id) + body


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of "host:port" or "[v6]:port"; ValueError otherwise."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not host:port: {address!r}")
    return host, int(port)


class Frames:
    """Splits a byte stream into frames; None past the size limit (a protocol error)."""

    def __init__(self, max_frame: int) -> None:
        self._buf = bytearray()
        self.limit = max_frame

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]] | None:
        buf = self._buf
        buf += data
        out: list[tuple[int, int, bytes]] = []
        pos = 0
        n = len(buf)
        while n - pos >= HEADER_BYTES:
            length, kind, call_id = _HEAD.unpack_from(buf, pos)
            if length < 5 or length + 4 > self.limit:
                return None
            end = pos + 4 + length
            if end > n:
                break
            out.append((kind, call_id, bytes(buf[pos + HEADER_BYTES : end])))
            pos = end
        if pos:
            del buf[:pos]
        if len(buf) > self.limit:  # a length not read yet cannot make it smaller
            return None
        return out


# The link a call being served came in on (None: NATS or gRPC): the queue keeps it with the
# lease of the reader named in a Read or Ack, and pushes that reader's notices on it.
CURRENT_LINK: ContextVar[ServerLink | None] = ContextVar("queue_link", default=None)


class ServerLink(asyncio.Protocol):
    """The queue's end of one node's link."""

    def __init__(self, server: LinkServer) -> None:
        self._server = server
        self._frames = Frames(HELLO_MAX_BYTES)  # the server's limit once HELLO passed
        self._transport: asyncio.Transport | None = None
        self._hello = False
        self._hello_timer: asyncio.TimerHandle | None = None
        self._waiting: deque[tuple[int, int, bytes]] = deque()
        self._in_flight = 0
        self._paused = False  # reading paused (self._update_reading)
        self._write_blocked = False  # unsent replies above WRITE_BUFFER_HIGH
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if len(self._server.links) >= MAX_LINKS or self._server.stopping:
            self._refuse("too many links" if not self._server.stopping else "stopping")
            return
        tune(transport)
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        self._server.links.add(self)
        self._hello_timer = asyncio.get_running_loop().call_later(
            HELLO_TIMEOUT_S, self._refuse, "no hello in time"
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._waiting.clear()
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        self._server.links.discard(self)

    def pause_writing(self) -> None:
        self._write_blocked = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_blocked = False
        self._drain()

    def _refuse(self, why: str) -> None:
        if self.closed:
            return
        log.warning("queue_link_refused", extra={"reason": why})
        self.closed = True
        self._waiting.clear()
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        frames = self._frames.feed(data)
        if frames is None:
            self._refuse("frame too large")
            return
        self._waiting.extend(frames)
        self._drain()

    def _drain(self) -> None:
        """Serve the frames that came while fewer than MAX_IN_FLIGHT calls run and the
        replies go out; stop reading the link while any wait (at most one read's worth)."""
        waiting = self._waiting
        while (
            waiting
            and not self.closed
            and not self._server.stopping
            and not self._write_blocked
            and self._in_flight < MAX_IN_FLIGHT
        ):
            kind, call_id, body = waiting.popleft()
            if not self._hello:
                if kind != HELLO or not self._server.admits(body):
                    self._refuse("no hello or wrong secret")
                    return
                self._hello = True
                self._frames.limit = self._server.max_frame
                if self._hello_timer is not None:
                    self._hello_timer.cancel()
            elif kind == CALL and body:
                self._serve(call_id, body[0], body[1:])
            else:
                self._refuse(f"unexpected frame kind {kind}")
                return
        self._update_reading()

    def _update_reading(self) -> None:
        t = self._transport
        if t is None or self.closed:
            return
        hold = (
            bool(self._waiting)
            or self._in_flight >= MAX_IN_FLIGHT
            or self._write_blocked
            or self._server.stopping
        )
        if hold and not self._paused:
            self._paused = True
            t.pause_reading()
        elif not hold and self._paused:
            self._paused = False
            t.resume_reading()

    def _serve(self, call_id: int, method: int, data: bytes) -> None:
        handler = self._server.handlers.get(method)
        if handler is None:
            self._send(frame(ERROR, call_id, f"UNIMPLEMENTED no method {method}".encode()))
            return
        self._in_flight += 1
        self._server.tasks.spawn(self._answer(call_id, method, handler, data))

    async def _answer(self, call_id: int, method: int, handler: Handler, data: bytes) -> None:
        CURRENT_LINK.set(self)  # this task's own context
        started = time.perf_counter()
        outcome = "OK"
        try:
            out = await handler(data)
            if len(out) + HEADER_BYTES > self._server.max_frame:
                self._send(frame(ERROR, call_id, TOO_LARGE.encode()))
            else:
                self._send(frame(REPLY, call_id, out))
        except Exception as exc:
            code, details = status_for(exc)
            outcome = code.name
            if code == grpc.StatusCode.INTERNAL:
                log.exception("queue_link_call_failed", extra={"method": method})
            self._send(frame(ERROR, call_id, f"{code.name} {details}".encode()))
        finally:
            self._in_flight -= 1
            if self._paused:
                self._drain()
            name = self._server.names.get(method, "link")
            red.record(name, outcome, time.perf_counter() - started, "link")

    def _send(self, data: bytes) -> None:
        if not self.closed and self._transport is not None:
            self._transport.write(data)

    def notice(self, body: bytes) -> bool:
        """Push a notice to the node; False when it cannot go now (send it on NATS)."""
        t = self._transport
        if self.closed or t is None or t.get_write_buffer_size() > NOTICE_BUFFER_MAX:
            return False
        if len(body) + HEADER_BYTES > self._server.max_frame:
            return False
        t.write(frame(NOTICE, 0, body))
        return True

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class LinkServer:
    """Accepts nodes' links; serves `handlers` (method code -> handler of request bytes)."""

    def __init__(self, handlers: dict[int, Handler], secret: str | None, max_frame: int) -> None:
        """`secret`: what a node's HELLO must carry (None: mesh_auth disabled, anything)."""
        self.handlers = handlers
        self.names = {code: subject for subject, code in METHODS.items()}
        self.max_frame = max_frame
        self.links: set[ServerLink] = set()
        self.tasks = TaskSet()
        self.stopping = False
        self._secret = None if secret is None else secret.encode()
        self._server: asyncio.Server | None = None
        self.port = 0

    def admits(self, proof: bytes) -> bool:
        return self._secret is None or (
            bool(self._secret) and hmac.compare_digest(proof, self._secret)
        )

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: ServerLink(self), host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self, grace_s: float = 5.0) -> None:
        """No new links or calls; the calls under way are answered (for at most `grace_s`,
        then cancelled: their callers send them again over NATS), then the links close."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for link in list(self.links):
            link._update_reading()
        await self.tasks.wait(grace_s)
        await self.tasks.cancel()
        for link in list(self.links):
            link.close()
