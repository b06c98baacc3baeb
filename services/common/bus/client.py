"""NATS helpers: connect with bounded retries, protobuf publish/request with trace context.

`connect(url)` waits at most `wait_s` seconds (setting `dependency_wait_s`,
services/common/dependencies.py) for a first connection, then raises; nothing here waits
forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
from google.protobuf.message import Message
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.telemetry import inject

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)
PING_INTERVAL_S = 5
MAX_OUTSTANDING_PINGS = 3


async def connect(
    url: str,
    name: str,
    wait_s: float = 60.0,
    no_echo: bool = False,
    on_closed: Callable[[], Awaitable[None]] | None = None,
    on_reconnected: Callable[[], Awaitable[None]] | None = None,
    user: str = "",
    password: str = "",
) -> Client:
    """Connect to NATS, retrying start-up races with backoff; reconnects are nats-py's job.

    `no_echo`: the server does not deliver this connection's own publishes back to it.
    `on_closed`: called when the connection is closed for good while nobody asked for it:
    nats-py reconnects after a network error but gives up after a protocol error the server
    reports (`-ERR`), and a service must not go on as if it could still carry traffic.
    `on_reconnected`: called after each reconnect (what was published to this connection's
    subscriptions meanwhile is lost).
    `user`/`password`: this service's NATS credentials (settings nats_user/nats_password);
    credentials inside `url` work too.
    """
    auth = {"user": user, "password": password} if user else {}
    # nats-py itself retries the first connection until it succeeds (every 0.5 s, each
    # failure logged as `nats: encountered error`: max_reconnect_attempts=-1 holds for it
    # too), so the bound is a timeout around it.
    try:
        return await asyncio.wait_for(
            nats.connect(
                [u.strip() for u in url.split(",")],
                name=name,
                connect_timeout=2,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                allow_reconnect=True,
                # A silently dead connection (a cut link) is noticed in ~15-20 s rather than
                # nats-py's 4 minutes (120 s x 2); not shorter, so that a process starved of
                # CPU for a few seconds is not cut off by its own pings.
                ping_interval=PING_INTERVAL_S,
                max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                no_echo=no_echo,
                **({"closed_cb": on_closed} if on_closed is not None else {}),
                **({"reconnected_cb": on_reconnected} if on_reconnected is not None else {}),
                **auth,
            ),
            wait_s,
        )
    except TimeoutError as exc:
        raise TimeoutError(f"NATS ({url}) did not accept a connection in {wait_s:g} s") from exc


class LateClient:
    """Stands in for a NATS client that `start()` connects later (servicers are built first).

    Attribute access is forwarded to the real client once `nc` is set.
    """

    def __init__(self) -> None:
        self.nc: Client | None = None

    def __getattr__(self, name: str) -> object:
        if self.nc is None:
            raise RuntimeError("NATS is not connected yet")
        return getattr(self.nc, name)


def _headers() -> dict[str, str] | None:
    h = inject()
    return h or None


async def publish_proto(nc: Client, subject: str, message: Message) -> None:
    await nc.publish(subject, message.SerializeToString(), headers=_headers())


async def request_proto(
    nc: Client, subject: str, message: Message, reply_type: type[M], timeout_s: float = 2.0
) -> M:
    """Send a protobuf request and parse the protobuf reply."""
    msg = await nc.request(
        subject, message.SerializeToString(), timeout=timeout_s, headers=_headers()
    )
    reply = reply_type()
    reply.ParseFromString(msg.data)
    return reply


def parse(msg: Msg, message_type: type[M]) -> M:
    out = message_type()
    out.ParseFromString(msg.data)
    return out


async def drain(nc: Client, timeout_s: float = 1.0) -> None:
    """Drain `nc` (handlers under way finish, buffered publishes leave), but for at most
    `timeout_s`: a pull subscription of a JetStream consumer can hold a drain for nats-py's
    30 s default, which kept stopping services past their grace period. Then close."""
    try:
        await asyncio.wait_for(nc.drain(), timeout_s)
    except Exception as exc:  # timed out, or the connection was already gone
        log.info("nats_drain_cut_short", extra={"error": type(exc).__name__})
    if not nc.is_closed:
        await nc.close()
