"""Attacks on the ban list's matching and on flapping detection (its counts in the test
session's Redis, shared by session instances): an address ban
cannot be dodged by the form of the address (IPv4-mapped IPv6, WebSocket peers, a CIDR
member), a tenant's ban does not reach another tenant, and a client that changes its id on
every reconnect is caught by the per-address count."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from services.common.bans import Ban, BanKind, BanList, normalized, peer_ip
from services.session.flapping import FlapDetector, address_of, count_key


def ban(kind: BanKind, value: str, tenant: str = "", expires: int = 0) -> Ban:
    return normalized(Ban(kind=kind, tenant=tenant, value=value, expires_at_ms=expires))


@pytest.mark.parametrize(
    "peer",
    [
        "10.1.2.3:5000",
        "::ffff:10.1.2.3:5000",
        "[::ffff:10.1.2.3]:5000",
        "ws:10.1.2.3",
        "ws:::ffff:10.1.2.3",
    ],
)
def test_a_cidr_ban_catches_every_form_of_a_member_address(peer: str) -> None:
    bans = BanList([ban(BanKind.ADDRESS, "10.0.0.0/8")])
    assert bans.match("t", "c", "u", peer, 0) is not None


def test_a_mapped_ban_value_is_the_ipv4_ban() -> None:
    b = ban(BanKind.ADDRESS, "::ffff:192.0.2.1")
    assert b.value == "192.0.2.1/32"
    assert BanList([b]).match("t", "c", "", "192.0.2.1:1", 0) is not None


def test_ipv6_bans_and_neighbours() -> None:
    bans = BanList([ban(BanKind.ADDRESS, "2001:db8::/32")])
    assert bans.match("t", "c", "", "2001:db8::1:443", 0) is not None
    assert bans.match("t", "c", "", "2001:db9::1:443", 0) is None
    assert bans.match("t", "c", "", "11.0.0.1:1", 0) is None


def test_tenant_scoped_bans_stay_in_their_tenant_and_expire() -> None:
    bans = BanList(
        [
            ban(BanKind.CLIENT_ID, "dev-1", "acme"),
            ban(BanKind.USERNAME, "mallory", "acme", expires=1000),
            ban(BanKind.ADDRESS, "192.0.2.0/24", "acme"),
        ]
    )
    assert bans.match("acme", "dev-1", "", "x", 0) is not None
    assert bans.match("other", "dev-1", "", "x", 0) is None
    assert bans.match("acme", "d", "mallory", "x", 999) is not None
    assert bans.match("acme", "d", "mallory", "x", 1000) is None  # expired
    assert bans.match("acme", "d", "", "192.0.2.9:1", 0) is not None
    assert bans.match("other", "d", "", "192.0.2.9:1", 0) is None


def test_a_client_id_or_user_ban_needs_a_tenant_and_an_address_must_parse() -> None:
    with pytest.raises(ValueError, match="tenant"):
        ban(BanKind.CLIENT_ID, "c")
    with pytest.raises(ValueError):
        ban(BanKind.ADDRESS, "not-an-ip")


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    r = Redis.from_url(redis_url)
    yield r
    await r.aclose()


async def test_flapping_of_one_client_id_from_one_address(redis: Redis) -> None:
    d = FlapDetector(redis, max_connects=3, window_s=10)
    c = f"c-{uuid.uuid4().hex}"
    assert [await d.connected("t", c, "192.0.2.1:1", i * 1000) for i in range(3)] == [None] * 3
    flap = await d.connected("t", c, "192.0.2.1:2", 3000)
    assert flap is not None and (flap.client_id, flap.address) == (c, "192.0.2.1")
    # Spread over the window: never flapping.
    c2 = f"c-{uuid.uuid4().hex}"
    assert all([await d.connected("t", c2, "192.0.2.1:1", i * 4000) is None for i in range(10)])


async def test_changing_the_client_id_does_not_evade_the_address_count(redis: Redis) -> None:
    d = FlapDetector(redis, max_connects=3, window_s=10, max_per_address=5)
    ip = f"192.0.2.{uuid.uuid4().int % 250 + 1}"
    flaps = [await d.connected("t", f"id-{i}", f"::ffff:{ip}:9", i * 100) for i in range(6)]
    assert flaps[:5] == [None] * 5
    assert flaps[5] is not None and flaps[5].client_id == "" and flaps[5].address == ip


async def test_two_session_instances_count_together(redis_url: str) -> None:
    """Each session instance has its own Redis connection; a client whose CONNECTs the
    queue group spreads over both is caught at the same count as on one."""
    instances = [Redis.from_url(redis_url) for _ in range(2)]
    try:
        ds = [FlapDetector(r, 15, 60.0, instance=f"session-{i}") for i, r in enumerate(instances)]
        c = f"c-{uuid.uuid4().hex}"
        flaps = [await ds[i % 2].connected("t", c, "192.0.2.9:1", 5_000 + i) for i in range(16)]
        assert flaps[:15] == [None] * 15 and flaps[15] is not None
        assert flaps[15].connects == 16
        # The count started over: the next ban only after as many again.
        assert await ds[0].connected("t", c, "192.0.2.9:1", 6_000) is None
    finally:
        for r in instances:
            await r.aclose()


async def test_flapping_memory_is_bounded(redis: Redis) -> None:
    """Every key holds at most max + 1 times and expires a window after its last CONNECT."""
    d = FlapDetector(redis, max_connects=3, window_s=10)
    c = f"c-{uuid.uuid4().hex}"
    for i in range(3):
        await d.connected("t", c, "192.0.2.1:1", i)
    for i in range(3, 41):  # a flood: bans come and go, the key never grows
        await d.connected("t", c, "192.0.2.1:1", i)
        key = count_key("t", c, "192.0.2.1")
        assert await redis.zcard(key) <= 3
    assert 0 < await redis.pttl(key) <= 10_000


async def test_connects_counted_together_are_counted_in_order(redis: Redis) -> None:
    """The CONNECTs of one loop turn go as one script call: each still gets its own answer,
    counted in the order they came (the 4th of max 3 flaps, the count starts over)."""
    d = FlapDetector(redis, max_connects=3, window_s=10)
    c = f"c-{uuid.uuid4().hex}"
    other = f"c-{uuid.uuid4().hex}"
    flaps = await asyncio.gather(
        *(d.connected("t", c, "192.0.2.1:1", i) for i in range(6)),
        d.connected("t", other, "192.0.2.1:1", 0),
    )
    assert [f is not None for f in flaps] == [False, False, False, True, False, False, False]
    assert flaps[3] is not None and (flaps[3].client_id, flaps[3].connects) == (c, 4)
    assert await redis.zcard(count_key("t", c, "192.0.2.1")) == 2


async def test_redis_unreachable_lets_the_connect_through() -> None:
    dead = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    try:
        assert await FlapDetector(dead, 1, 10.0).connected("t", "c", "192.0.2.1:1", 0) is None
    finally:
        await dead.aclose()


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("127.0.0.1:5000", "127.0.0.1"),
        ("::1:5000", "::1"),
        ("::ffff:10.0.0.1:80", "10.0.0.1"),  # IPv4-mapped: counted as the IPv4 address
        ("[::1]:80", "::1"),
        ("ws:1.2.3.4", "1.2.3.4"),
        ("fake:1", "fake:1"),  # no IP: the peer as it is
    ],
)
def test_flapping_counts_per_ip_whatever_the_peer_form(peer: str, address: str) -> None:
    """The cached address parse gives what `peer_ip` gives, twice (the second from cache)."""
    for _ in range(2):
        assert address_of(peer) == address
        ip = peer_ip(peer)
        assert address == (str(ip) if ip is not None else peer)
