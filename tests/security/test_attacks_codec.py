"""Hostile clients against a real node: floods and stalls aimed at the codec and the
per-connection limits. Each attack runs beside a `Bystander` on the same node, whose
publish-to-deliver round trip must stay under 100 ms with nothing lost, and the attacker
must get the documented answer (docs/security.md) and be counted in the node's
`starling_limit_refusals` metric.

Attackers speak over asyncio streams (raw bytes, tests/security/attack_wire.py), so
they never block the loop the bystander is timed on.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
import uuid

import pytest

from services.common.mqtt import (
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    PingReq,
    PubAck,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    encode,
)
from services.common.mqtt.packets import Packet
from tests.conftest import MeshInfo
from tests.poll import eventually
from tests.security.attack_wire import (
    _attack,
    _bare,
    _connected,
    _counted,
    _limit_hits,
    _rss_bytes,
    _send_and_collect,
    _sustained,
    _user_props,
    _ws_huge_frame,
)
from tests.security.bystander import Bystander, assert_unharmed

CONNECT_TIMEOUT_S = 5.0  # the node's default connect_timeout_s
pytestmark = [pytest.mark.timeout(120), pytest.mark.alone]  # a bystander's latency


def _check(b: Bystander) -> None:
    assert_unharmed(b)


# ---- property flood before authentication -------------------------------------------------


async def test_property_flood_connect_is_refused_before_auth(mesh: MeshInfo) -> None:
    """40,000 user properties (280 KB) in a CONNECT: refused from the fixed header (0x95);
    8,000 (under 64 KiB): refused after 256 of them (0x97). No CONNECT reaches the session
    service, and the bystander does not notice."""
    port = mesh.node(0)
    huge = encode(Connect("flood-huge", 5, properties=_user_props(40_000)), 5)
    under = encode(Connect("flood-small", 5, properties=_user_props(8_000)), 5)
    assert len(huge) > 250_000 and len(under) < 64 << 10
    before = await _limit_hits(mesh, 0)

    async def attack(n: int) -> tuple[bytes, list[Packet]]:
        flood = huge if n % 2 else under
        return flood, await _attack(port, flood)

    async with Bystander(port) as b:
        answers = await _sustained(attack)
    _check(b)
    # The answer may be lost to the reset of a connection closed with a flood unread;
    # whenever it arrives it is the CONNACK with the reason.
    expected = {huge: ConnAck(False, 0x95), under: ConnAck(False, 0x97)}
    assert all(_bare(got) in ([], [expected[flood]]) for flood, got in answers), answers
    assert sum(bool(got) for _, got in answers) >= len(answers) // 2, answers
    n_huge = sum(flood is huge for flood, _ in answers)
    await _counted(mesh, 0, before, "max_connect_packet_size_bytes", n_huge)
    await _counted(mesh, 0, before, "max_user_properties", len(answers) - n_huge)


async def test_oversize_connect_gets_its_connack_from_the_header(mesh: MeshInfo) -> None:
    """Only the start of a 280 KB CONNECT sent: the CONNACK 0x95 comes without the rest."""
    huge = encode(Connect("flood-head", 5, properties=_user_props(40_000)), 5)
    assert _bare(await _attack(mesh.node(1), huge[:64])) == [ConnAck(False, 0x95)]
    v311 = encode(Connect("x" * 65_000, 4, will=None), 4) + b"\x00" * 2000
    assert await _attack(mesh.node(1), v311[:64], level=4) == []  # 3.1.1: just closed


# ---- SUBSCRIBE floods ---------------------------------------------------------------------


async def test_subscribe_with_100000_filters_is_disconnected_0x97(mesh: MeshInfo) -> None:
    """Eleven SUBSCRIBE packets of 100,000 filters: the first one ends the connection after
    reading 100 of its filters (DISCONNECT 0x97); nothing is subscribed."""
    port = mesh.node(0)
    packet = encode(Subscribe(1, tuple(Subscription(f"f/{i}", 1) for i in range(100_000))), 5)
    assert len(packet) < 1 << 20
    flood = packet * 11
    before = await _limit_hits(mesh, 0)

    async def attack(n: int) -> list[Packet]:
        reader, writer, dec = await _connected(port, f"sub-flood-{n}")
        return await _send_and_collect(reader, writer, flood, 5, 10, dec)

    async with Bystander(port) as b:
        answers = await _sustained(attack, parallel=2)
    _check(b)
    assert all(_bare(got) in ([], [Disconnect(0x97)]) for got in answers), answers
    await _counted(mesh, 0, before, "max_filters_per_subscribe", len(answers))


@pytest.mark.parametrize("level", [5, 4])
async def test_many_subscribe_packets_stop_at_the_subscription_limit(
    mesh: MeshInfo, level: int
) -> None:
    """Fifteen SUBSCRIBEs of 100 new filters, sent without waiting: 1,000 are granted, the
    500 beyond get 0x97 (3.1.1: 0x80), every SUBACK arrives."""
    port = mesh.node(1)
    before = await _limit_hits(mesh, 1)
    refusal = 0x97 if level == 5 else 0x80
    async with Bystander(port) as b:
        reader, writer, dec = await _connected(port, f"sub-flood-many-{level}", level)
        for pid in range(1, 16):
            subs = tuple(Subscription(f"many/{pid}/{i}", 1) for i in range(100))
            writer.write(encode(Subscribe(pid, subs), level))
        acks: list[Packet] = []
        async with asyncio.timeout(30):
            while len(acks) < 15:
                acks += dec.feed(await reader.read(65536))
        writer.close()
    _check(b)
    codes = [c for a in acks if isinstance(a, SubAck) for c in a.reason_codes]
    assert len(codes) == 1500
    assert codes.count(1) == 1000 and codes.count(refusal) == 500, codes
    await _counted(mesh, 1, before, "max_subscriptions_per_client", 500)


# ---- WebSocket ------------------------------------------------------------------------------


async def test_200_mib_websocket_frame_is_refused_from_its_header(mesh: MeshInfo) -> None:
    """A binary frame announcing 200 MiB: closed with 1009 (Message Too Big) before the node
    buffers it; its memory does not grow."""
    comp = mesh.mesh.by_name("connection-0")
    rss_before = _rss_bytes(comp.pid)
    before = await _limit_hits(mesh, 0)

    async def attack(n: int) -> tuple[bytes, int]:
        return await _ws_huge_frame(comp.ws_port)

    async with Bystander(comp.port) as b:
        answers = await _sustained(attack, parallel=2)
    _check(b)
    for frame, sent in answers:
        # A close frame whose status code is 1009; or a reset, if our stream overtook it.
        if frame:
            assert frame[0] == 0x88 and int.from_bytes(frame[2:4], "big") == 1009, frame
        assert sent < 32 << 20 or frame, "the node kept reading a 200 MiB frame"
    assert _rss_bytes(comp.pid) - rss_before < 50 << 20
    await _counted(mesh, 0, before, "max_packet_size_bytes", len(answers))


# ---- stalls -------------------------------------------------------------------------------


async def test_connections_that_never_finish_connect_are_closed(mesh: MeshInfo) -> None:
    """Sockets that send nothing, or half a CONNECT, are closed at the CONNECT timeout with
    no answer."""
    port = mesh.node(1)
    half = encode(Connect("half", 5, properties=_user_props(10)), 5)[:20]
    before = await _limit_hits(mesh, 1)
    streams = []
    started = time.monotonic()
    async with Bystander(port) as b:
        for i in range(20):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if i % 2:
                writer.write(half)
            streams.append((reader, writer))
        answers = await asyncio.gather(
            *(_send_and_collect(r, w, b"", 5, CONNECT_TIMEOUT_S + 5) for r, w in streams)
        )
    elapsed = time.monotonic() - started
    _check(b)
    assert answers == [[]] * 20
    assert elapsed < CONNECT_TIMEOUT_S + 4, elapsed
    await _counted(mesh, 1, before, "connect_timeout_s", 20)


@pytest.mark.parametrize(
    ("level", "asked", "told"), [(5, 65535, 3600), (5, 0, 3600), (5, 120, None), (4, 65535, None)]
)
async def test_huge_keep_alive_is_capped(
    mesh: MeshInfo, level: int, asked: int, told: int | None
) -> None:
    """Keep alive 65535 (18 hours) or 0 (forever): an MQTT 5 client is told 3600 (Server
    Keep Alive); a 3.1.1 client cannot be told, it is held to 3600 (counted)."""
    before = await _limit_hits(mesh, 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", mesh.node(0))
    writer.write(encode(Connect(f"ka-{level}-{asked}", level, keepalive_s=asked), level))
    dec = Decoder(level)
    got: list[Packet] = []
    async with asyncio.timeout(10):
        while not got:
            got += dec.feed(await reader.read(65536))
    writer.close()
    (ack,) = got
    assert isinstance(ack, ConnAck) and ack.reason_code == 0
    assert ack.properties.server_keep_alive == told
    if asked == 65535:
        await _counted(mesh, 0, before, "max_keepalive_s", 1)


# ---- floods of small control packets ------------------------------------------------------


@pytest.mark.parametrize(
    "packet",
    [PubAck(4242), PingReq(), PubRel(4242)],
    ids=["puback-of-unknown-ids", "pingreq", "pubrel-of-unknown-ids"],
)
async def test_a_flood_of_control_packets_is_disconnected_0x96(
    mesh: MeshInfo, packet: Packet
) -> None:
    """One client sending tiny packets nobody asked for (a million PUBACKs in a second held
    the node's loop for seconds): past the control-packet budget it gets DISCONNECT 0x96,
    and a bystander on the same node keeps its round trip."""
    port = mesh.node(0)
    before = await _limit_hits(mesh, 0)
    flood = encode(packet, 5) * 200_000  # 0.8-1 MB: far past the burst of 2,000
    async with Bystander(port) as b:
        reader, writer, dec = await _connected(port, f"flood-{uuid.uuid4().hex[:6]}")
        got = await _send_and_collect(reader, writer, flood, 5, 10, dec)
    disconnects = [p for p in got if isinstance(p, Disconnect)]
    assert [d.reason_code for d in disconnects] == [0x96], _bare(got)[-3:]
    _check(b)
    await _counted(mesh, 0, before, "control_packets_per_s", 1)


async def test_an_oversized_websocket_message_after_connect_counts_for_the_tenant(
    mesh: MeshInfo,
) -> None:
    """Over WebSocket as over TCP, a refusal after CONNECT is the client's tenant's (it was
    counted under `-`, the label of clients not yet known)."""
    import aiohttp

    comp = mesh.mesh.by_name("connection-0")

    def default_tenant_hits() -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{comp.metrics_port}/metrics") as r:
            text = r.read().decode()
        pattern = (
            r'^starling_limit_refusals_total\{[^}]*limit="max_packet_size_bytes"'
            r'[^}]*tenant="default"[^}]*\} (\S+)$'
        )
        found = re.search(pattern, text, re.M)
        return float(found.group(1)) if found else 0.0

    before = await asyncio.to_thread(default_tenant_hits)
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{comp.ws_port}/mqtt"
        async with http.ws_connect(url, protocols=("mqtt",), max_msg_size=0) as ws:
            await ws.send_bytes(encode(Connect(f"ws-big-{uuid.uuid4().hex[:6]}", 4), 4))
            ack = await ws.receive(timeout=10)
            assert ack.type is aiohttp.WSMsgType.BINARY and ack.data[:2] == b"\x20\x02"
            try:  # past max_packet_size_bytes: closed (1009) while it is still being sent
                await ws.send_bytes(b"\x00" * ((16 << 20) + 10))
                closed = await ws.receive(timeout=10)
                assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            except ConnectionError:
                pass

    async def counted() -> bool:
        return await asyncio.to_thread(default_tenant_hits) >= before + 1

    await eventually(counted, 5, "the refusal counted for the tenant", every_s=0.1)
