"""Payloads larger than one NATS message: held by their sender, fetched by reference.

NATS carries at most the server's `max_payload` per message (`NATS_MAX_PAYLOAD` in the
configs the launcher and `starling secrets` write; nats-py reports the server's own value as
`nc.max_payload`, which is what counts). MQTT allows packets up to 256 MiB. A payload over
`limit(nc)` is not published as such: the `Holder` of the sending process keeps it (bounded
in bytes and time) and publishes, on the same subject and in the same place in its order, an
empty message whose `REF_HEADER` says where to fetch what; a receiver asks the holder for it
in pieces below max_payload (NATS request/reply) and handles the whole payload as if it had
come in one message (`resolve`), holding up later messages of that subscription meanwhile,
so order is kept.

Why a reference and not chunks on the subject: NATS gives each message of a queue group
(shared subscriptions) to any member, so the chunks of one payload would land on different
nodes; a reference is one message, and the member NATS picks fetches it. Memory: a holder
keeps at most `max_bytes` (oldest dropped first) for at most `hold_s`; a process fetches at
most `FETCHES` payloads at once. A reference whose payload is gone (dropped, expired, sender
dead) is skipped and logged: the transient path is at most once, and persistent sessions get
their copy from their durable queue, never from here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.topics.subject import escape_token

log = logging.getLogger("starling.bus.large")

NATS_MAX_PAYLOAD = 8 << 20  # what the launcher writes; NATS advises no more
HEADROOM = 64 << 10  # headers and protocol beside a payload
REF_HEADER = "Starling-Ref"  # "<fetch subject> <id> <size>"
FETCHES = 2  # payloads one process fetches at once
FETCH_TIMEOUT_S = 5.0  # per piece


def limit(nc: Client) -> int:
    """The largest payload published as one NATS message on this connection."""
    return max(1024, min(nc.max_payload or NATS_MAX_PAYLOAD, NATS_MAX_PAYLOAD) - HEADROOM)


class Holder:
    """The payloads this process published by reference, served to whoever fetches them."""

    def __init__(self, owner: str, max_bytes: int, hold_s: float = 30.0) -> None:
        self.subject = f"mqf.{escape_token(owner)}"
        self._max_bytes = max_bytes
        self._hold_s = hold_s
        self._held: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._bytes = 0
        self._ids = itertools.count(1)
        self._piece = NATS_MAX_PAYLOAD - HEADROOM

    async def start(self, nc: Client) -> None:
        """Serve fetches on `nc` (one subscription on this process's fetch subject)."""
        self._piece = limit(nc)
        await nc.subscribe(self.subject, cb=self._serve)

    async def publish(
        self, nc: Client, subject: str, data: bytes, headers: dict[str, str] | None = None
    ) -> None:
        """Publish `data` on `subject`: as is when it fits one NATS message, else by
        reference."""
        if len(data) <= limit(nc):
            await nc.publish(subject, data, headers=headers)
            return
        ref = self.hold(data)
        await nc.publish(subject, b"", headers={**(headers or {}), REF_HEADER: ref})

    def hold(self, data: bytes) -> str:
        """Keep `data` for fetching; returns the reference header value."""
        self._expire(time.monotonic())
        id = str(next(self._ids))
        self._held[id] = (time.monotonic(), data)
        self._bytes += len(data)
        while self._bytes > self._max_bytes and len(self._held) > 1:
            old, (_, dropped) = self._held.popitem(last=False)
            self._bytes -= len(dropped)
            log.warning("large_message_dropped", extra={"id": old, "bytes": len(dropped)})
        return f"{self.subject} {id} {len(data)}"

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def _expire(self, now: float) -> None:
        while self._held:
            id, (at, data) = next(iter(self._held.items()))
            if now - at <= self._hold_s:
                return
            del self._held[id]
            self._bytes -= len(data)

    async def _serve(self, msg: Msg) -> None:
        """A fetch: "<id> <offset>" -> the piece from offset (empty: not held any more)."""
        try:
            id, offset = msg.data.decode().split()
            start = int(offset)
        except ValueError:
            return
        self._expire(time.monotonic())
        held = self._held.get(id)
        piece = held[1][start : start + self._piece] if held is not None else b""
        await msg.respond(piece)


class Fetcher:
    """Resolves references on one NATS connection, at most `concurrency` at once."""

    def __init__(self, nc: Client, concurrency: int = FETCHES) -> None:
        self._nc = nc
        self._slots = asyncio.Semaphore(concurrency)

    async def resolve(self, msg: Msg) -> bytes | None:
        """The payload `msg` carries, fetched from its holder when it is a reference; None
        when the holder no longer has it."""
        ref = msg.headers.get(REF_HEADER) if msg.headers else None
        if ref is None:
            return msg.data
        try:
            subject, id, size_text = ref.split()
            size = int(size_text)
        except ValueError:
            log.warning("large_message_bad_reference", extra={"ref": ref[:200]})
            return None
        async with self._slots:
            parts: list[bytes] = []
            got = 0
            while got < size:
                try:
                    reply = await self._nc.request(subject, f"{id} {got}".encode(), FETCH_TIMEOUT_S)
                except Exception as exc:  # holder gone or slow: the message is skipped
                    log.warning("large_message_fetch_failed", extra={"error": type(exc).__name__})
                    return None
                if not reply.data:
                    log.warning("large_message_gone", extra={"ref": ref})
                    return None
                parts.append(reply.data)
                got += len(reply.data)
            return b"".join(parts)
