"""Hostile peers of the queue link (services/queue/link.py): whoever reaches its port without
the mesh secret, or sends frames that break the format, gets its connection closed with no
call served, and the nodes' own links go on working."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import pytest

from services.queue import link as link_module
from services.queue.link import CALL, HELLO, LinkServer, frame
from services.queue.link_client import QueueLink
from tests.poll import eventually
from tests.queue.test_link import opened

SECRET = "mesh-secret"
MAX_FRAME = 4096


@pytest.fixture
async def server() -> AsyncIterator[tuple[LinkServer, list[bytes]]]:
    served: list[bytes] = []

    async def handler(data: bytes) -> bytes:
        served.append(data)
        return data

    s = LinkServer({1: handler}, SECRET, MAX_FRAME)
    await s.start("127.0.0.1", 0)
    yield s, served
    await s.stop(0.5)


async def _closed_after(port: int, data: bytes) -> bool:
    """Send `data` on a fresh connection; True if the server closed it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        rest = await asyncio.wait_for(reader.read(), 5.0)  # EOF once closed
    finally:
        writer.close()
    return rest == b""


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param(frame(CALL, 1, b"\x01payload"), id="call-without-hello"),
        pytest.param(frame(HELLO, 0, b"guess") + frame(CALL, 1, b"\x01x"), id="wrong-secret"),
        pytest.param(frame(HELLO, 0, b"") + frame(CALL, 1, b"\x01x"), id="empty-secret"),
        pytest.param(
            frame(HELLO, 0, SECRET.encode()) + struct.pack(">IBI", 1 << 30, CALL, 1),
            id="length-past-the-limit",
        ),
        pytest.param(
            frame(HELLO, 0, SECRET.encode()) + struct.pack(">IBI", 2, CALL, 1), id="length-short"
        ),
        pytest.param(frame(HELLO, 0, SECRET.encode()) + frame(99, 1, b"x"), id="unknown-kind"),
        pytest.param(frame(HELLO, 0, SECRET.encode()) + frame(CALL, 1, b""), id="no-method"),
        # Before HELLO a frame may not be larger than a secret needs: a stranger cannot make
        # the queue buffer a whole frame's worth.
        pytest.param(struct.pack(">IBI", 2000, HELLO, 0) + b"z" * 1000, id="big-hello"),
    ],
)
async def test_a_hostile_link_is_closed_and_the_others_go_on(
    server: tuple[LinkServer, list[bytes]], attack: bytes
) -> None:
    s, served = server
    good = await opened(QueueLink(f"127.0.0.1:{s.port}", SECRET, MAX_FRAME, lambda _: None))
    try:
        served.clear()  # opened() sent one call
        assert await good.call(1, b"before", 2.0) == b"before"
        assert await _closed_after(s.port, attack)
        assert served == [b"before"]  # nothing of the attacker's was served
        assert await good.call(1, b"after", 2.0) == b"after"
    finally:
        good.close()


async def test_a_flood_of_calls_on_one_link_is_answered_in_full(
    server: tuple[LinkServer, list[bytes]],
) -> None:
    """20,000 calls written at once: the server serves at most MAX_IN_FLIGHT at a time and
    stops reading meanwhile (the rest wait in TCP), and resuming loses none of them."""
    s, served = server
    reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
    try:
        writer.write(frame(HELLO, 0, SECRET.encode()))
        burst = b"".join(frame(CALL, i, b"\x01" + b"y" * 100) for i in range(1, 20_001))
        writer.write(burst)
        got = 0
        while got < 20_000:  # every call is answered, in time
            head = await asyncio.wait_for(reader.readexactly(9), 10.0)
            length = struct.unpack(">I", head[:4])[0]
            await reader.readexactly(length - 5)
            got += 1
        assert len(served) == 20_000
    finally:
        writer.close()


async def test_a_link_that_never_says_hello_is_closed(
    server: tuple[LinkServer, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(link_module, "HELLO_TIMEOUT_S", 0.2)
    s, _ = server
    assert await _closed_after(s.port, b"")


async def test_links_past_the_cap_are_closed_at_once(
    server: tuple[LinkServer, list[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(link_module, "MAX_LINKS", 2)
    s, _ = server
    held = [await asyncio.open_connection("127.0.0.1", s.port) for _ in range(2)]
    try:
        await eventually(lambda: len(s.links) == 2, 5, "both links held", every_s=0.01)
        assert await _closed_after(s.port, frame(HELLO, 0, SECRET.encode()))
    finally:
        for _, writer in held:
            writer.close()
