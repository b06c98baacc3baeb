"""The node's end of the queue link (the protocol, and why: services/queue/link.py): one
connection per queue instance, opened in the background, whose calls fail in ways that tell
the caller whether to send them another way."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import cast

import grpc

from services.common.bus.unary import TOO_LARGE, ReplyTooLargeError
from services.common.rpc.errors import UnavailableError, error_for
from services.queue.link import (
    CALL,
    HEADER_BYTES,
    HELLO,
    NOTICE,
    REPLY,
    Frames,
    frame,
    parse_address,
    tune,
)

log = logging.getLogger("starling.queue.link")

CONNECT_TIMEOUT_S = 1.0
RETRY_S = 5.0  # a link that could not be opened (or was refused) is not tried for this long
# A node accepts frames up to this many times its own limit: the two ends take their limits
# from their own NATS connections, which may disagree a little.
RECEIVE_SLACK = 4


class LinkDownError(Exception):
    """The link could not take the call, which was not sent: send it another way."""


class LinkLostError(UnavailableError):
    """The link broke with the call under way, or gave no reply in time (its outcome
    unknown): the instance may be alive, so the caller sends it again another way (every
    call of the link may be repeated)."""


class QueueLink(asyncio.Protocol):
    """A node's link to one queue instance, opened in the background at its first call and
    again after a break; `on_notice` gets the body of each NOTICE frame, `on_change` is
    called when a connection opens or breaks (notices may have been lost in between).
    ValueError for an address that is not host:port."""

    def __init__(
        self,
        address: str,
        secret: str,
        max_frame: int,
        on_notice: Callable[[bytes], None],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._host, self._port = parse_address(address)
        self.address = address
        self._secret = secret.encode()
        self.max_frame = max_frame
        self._on_notice = on_notice
        self._on_change = on_change
        self._transport: asyncio.Transport | None = None
        self._frames = Frames(max_frame * RECEIVE_SLACK)
        self._calls: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self._ids = itertools.count(1)
        self._opening: asyncio.Task[None] | None = None
        self._down_until = 0.0
        self._heard = False  # a frame came on the current connection
        self._closed = False  # closed for good (the node stops)

    # --- asyncio.Protocol ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tune(transport)
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._frames = Frames(self.max_frame * RECEIVE_SLACK)
        self._heard = False
        self._transport.write(frame(HELLO, 0, self._secret))
        if self._closed:
            self._transport.close()
        self._on_change()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if not self._heard:
            # Closed before answering anything (a refused secret, an instance stopping):
            # do not reopen it at once.
            self._down_until = time.monotonic() + RETRY_S
        calls, self._calls = self._calls, {}
        for fut in calls.values():
            if not fut.done():
                fut.set_exception(LinkLostError(f"queue link to {self.address} lost"))
        self._on_change()

    def data_received(self, data: bytes) -> None:
        frames = self._frames.feed(data)
        if frames is None:
            log.warning("queue_link_bad_frame", extra={"address": self.address})
            self._drop()
            return
        self._heard = True
        for kind, call_id, body in frames:
            if kind == NOTICE:
                try:
                    self._on_notice(body)
                except Exception:
                    log.exception("queue_link_notice_failed")
                continue
            fut = self._calls.pop(call_id, None)
            if fut is not None and not fut.done():
                fut.set_result((kind, body))

    # --- calls ---
    def _drop(self) -> None:
        """Close the connection (its calls fail with LinkLostError); reopen after RETRY_S."""
        self._down_until = time.monotonic() + RETRY_S
        if self._transport is not None:
            self._transport.close()

    def _ready(self) -> asyncio.Transport:
        """The open connection; LinkDownError (and an opening in the background, if it
        may) when there is none yet."""
        t = self._transport
        if t is not None and not t.is_closing():
            return t
        if self._closed or time.monotonic() < self._down_until:
            raise LinkDownError(self.address)
        if self._opening is None or self._opening.done():
            self._opening = asyncio.ensure_future(self._connect())
        raise LinkDownError(self.address)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: self, self._host, self._port), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            self._down_until = time.monotonic() + RETRY_S
            log.warning(
                "queue_link_unreachable", extra={"address": self.address, "error": repr(exc)}
            )

    async def call(self, method: int, data: bytes, timeout_s: float) -> bytes:
        """The reply to `data`; LinkDownError if it was not sent (no link open now, or too
        large), LinkLostError if the link broke or no reply came in time, ReplyTooLargeError,
        or the ServiceError of an error reply."""
        if len(data) + 1 + HEADER_BYTES > self.max_frame:
            raise LinkDownError("request larger than a frame")
        t = self._ready()
        call_id = next(self._ids) & 0xFFFFFFFF
        fut: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut
        t.write(frame(CALL, call_id, bytes((method,)) + data))
        try:
            kind, body = await asyncio.wait_for(fut, timeout_s)
        except TimeoutError as exc:
            # A cut connection looks like this too: drop it, so the next calls do not each
            # wait a timeout on it.
            self._drop()
            raise LinkLostError(f"no reply on the queue link to {self.address} in time") from exc
        finally:
            self._calls.pop(call_id, None)
        if kind == REPLY:
            return body
        text = body.decode("utf-8", "replace")
        if text == TOO_LARGE:
            raise ReplyTooLargeError(self.address)
        name, _, details = text.partition(" ")
        raise error_for(getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN), details)

    def close(self) -> None:
        self._closed = True
        if self._opening is not None:
            self._opening.cancel()
        if self._transport is not None:
            self._transport.close()
