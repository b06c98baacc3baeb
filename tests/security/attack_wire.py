"""The attackers' side of tests/security/test_attacks_codec.py: raw bytes on fresh asyncio
streams (the packets are hostile on purpose, and the loop the bystander is timed on must
never block), a flood runner, a 200 MiB WebSocket frame, and the node's
`starling_limit_refusals` counts read from its metrics endpoint."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import os
import re
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import TypeVar

from services.common.mqtt import EMPTY, ConnAck, Connect, Decoder, Properties, encode
from services.common.mqtt.packets import Packet
from tests.conftest import MeshInfo
from tests.poll import eventually

T = TypeVar("T")


def _bare(packets: list[Packet]) -> list[Packet]:
    """The packets without their properties (reason strings are not what these check)."""
    return [
        dataclasses.replace(p, properties=EMPTY) if hasattr(p, "properties") else p for p in packets
    ]


async def _sustained(
    attack: Callable[[int], Awaitable[T]], seconds: float = 1.5, parallel: int = 4
) -> list[T]:
    """Run `attack(n)` over and over (`n` counts the runs), `parallel` at a time, for
    `seconds`: the bystander is measured under a flood, not a single shot."""
    deadline = time.monotonic() + seconds
    results: list[T] = []
    runs = itertools.count()

    async def worker() -> None:
        while time.monotonic() < deadline:
            results.append(await attack(next(runs)))

    await asyncio.gather(*(worker() for _ in range(parallel)))
    return results


def _limit_hits_now(mesh: MeshInfo, node: int) -> dict[str, float]:
    port = mesh.mesh.by_name(f"connection-{node}").metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    hits: dict[str, float] = {}  # summed over tenants
    for m in re.finditer(r"^starling_limit_refusals(?:_total)?\{([^}]*)\} (\S+)$", text, re.M):
        limit = re.search(r'limit="([^"]*)"', m.group(1))
        if limit:
            hits[limit.group(1)] = hits.get(limit.group(1), 0.0) + float(m.group(2))
    return hits


async def _limit_hits(mesh: MeshInfo, node: int) -> dict[str, float]:
    return await asyncio.to_thread(_limit_hits_now, mesh, node)


async def _counted(
    mesh: MeshInfo, node: int, before: dict[str, float], limit: str, at_least: int
) -> None:
    """Poll the node's metrics until `limit` grew by `at_least` (they are read on scrape)."""
    seen: dict[str, float] = {}

    async def grown() -> bool:
        seen.update(await _limit_hits(mesh, node))
        return seen.get(limit, 0) - before.get(limit, 0) >= at_least

    await eventually(grown, 5, lambda: f"{limit} grown by {at_least}: {seen}", every_s=0.1)


async def _attack(port: int, data: bytes, level: int = 5, timeout_s: float = 10) -> list[Packet]:
    """Send `data` on a fresh connection (as far as the server lets us), then collect what
    the server answers until it closes the connection; fails if it never does."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    return await _send_and_collect(reader, writer, data, level, timeout_s)


async def _send_and_collect(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    data: bytes,
    level: int,
    timeout_s: float,
    decoder: Decoder | None = None,
) -> list[Packet]:
    dec = decoder or Decoder(level)
    got: list[Packet] = []
    writer.write(data)
    try:
        async with asyncio.timeout(timeout_s):
            while chunk := await reader.read(65536):
                got += dec.feed(chunk)
    except ConnectionError:
        pass  # the server closed with our unread flood in its buffer: a reset
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open ({got})") from None
    finally:
        writer.close()
    return got


def _user_props(n: int) -> Properties:
    return Properties(user_property=tuple((f"k{i % 10}", "v") for i in range(n)))


async def _connected(
    port: int, client_id: str, level: int = 5
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Decoder]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode(Connect(client_id, level), level))
    dec = Decoder(level)
    ack: list[Packet] = []
    async with asyncio.timeout(10):
        while not ack:
            ack += dec.feed(await reader.read(65536))
    assert isinstance(ack[0], ConnAck) and ack[0].reason_code == 0, ack
    return reader, writer, dec


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _ws_huge_frame(port: int) -> tuple[bytes, int]:
    """Upgrade to WebSocket, announce one binary frame of 200 MiB and stream it; return the
    first bytes the server sent back after the upgrade, and how much of the frame it took."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Protocol: mqtt\r\n\r\n"
        ).encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 101"), head
    writer.write(b"\x82\xff" + (200 << 20).to_bytes(8, "big") + b"\x00\x00\x00\x00")
    sent = 0
    try:
        chunk = b"\x00" * (1 << 20)
        while sent < 32 << 20:  # keep streaming, as an attacker would
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)
    except ConnectionError:
        pass
    frame = b""
    try:
        async with asyncio.timeout(10):
            while len(frame) < 4 and (data := await reader.read(64)):
                frame += data
    except ConnectionError:
        pass
    writer.close()
    return frame, sent
