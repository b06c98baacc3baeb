"""The PROXY protocol parser (services/common/proxy_protocol.py) against HAProxy's
proxy-protocol.txt: a golden table of headers and of what must be refused, and properties
against an encoder written here from the spec (round trip, every prefix asks for more,
random bytes raise only ProxyProtocolError)."""

from __future__ import annotations

import ipaddress
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.proxy_protocol import (
    V2_SIGNATURE,
    Address,
    ProxyHeader,
    ProxyProtocolError,
    parse_proxy_header,
)

CONNECT = bytes.fromhex("101000044d5154540502003c000000") + b"\x00\x01c"  # an MQTT CONNECT


def v1(family: str, src: str, dst: str, sport: int, dport: int) -> bytes:
    return f"PROXY {family} {src} {dst} {sport} {dport}\r\n".encode()


def v2(
    src: Address | None,
    dst: Address | None,
    command: int = 1,
    kind: int | None = None,
    tlvs: bytes = b"",
    block: bytes | None = None,
) -> bytes:
    """A v2 header (2.2): TCP over IPv4/IPv6 from the addresses; `kind`/`block` override."""
    if block is None:
        block = b""
        if src is not None and dst is not None:
            ip_s, ip_d = ipaddress.ip_address(src.host), ipaddress.ip_address(dst.host)
            block = ip_s.packed + ip_d.packed + struct.pack("!HH", src.port, dst.port)
            if kind is None:
                kind = 0x11 if ip_s.version == 4 else 0x21
    body = block + tlvs
    return V2_SIGNATURE + bytes([0x20 | command, kind or 0]) + struct.pack("!H", len(body)) + body


def tlv(kind: int, value: bytes) -> bytes:
    return bytes([kind]) + struct.pack("!H", len(value)) + value


GOLDEN = [
    pytest.param(
        v1("TCP4", "192.168.0.1", "192.168.0.11", 56324, 443),
        ProxyHeader(1, 47, Address("192.168.0.1", 56324), Address("192.168.0.11", 443)),
        id="v1-tcp4-spec-example",
    ),
    pytest.param(
        v1("TCP6", "2001:db8::7", "2001:DB8::1", 0, 65535),
        ProxyHeader(1, 44, Address("2001:db8::7", 0), Address("2001:db8::1", 65535)),
        id="v1-tcp6",
    ),
    pytest.param(b"PROXY UNKNOWN\r\n", ProxyHeader(1, 15, None, None), id="v1-unknown-short"),
    pytest.param(
        b"PROXY UNKNOWN ffff:f::f ffff:f::f 65535 65535\r\n",
        ProxyHeader(1, 47, None, None),
        id="v1-unknown-rest-ignored",
    ),
    pytest.param(
        bytes.fromhex("0d0a0d0a000d0a515549540a2111000cac130001ac130003a6520050"),
        ProxyHeader(2, 28, Address("172.19.0.1", 42578), Address("172.19.0.3", 80)),
        id="v2-tcp4-as-haproxy-sends",
    ),
    pytest.param(
        v2(Address("2001:db8::5", 1), Address("::1", 1883)),
        ProxyHeader(2, 52, Address("2001:db8::5", 1), Address("::1", 1883)),
        id="v2-tcp6",
    ),
    pytest.param(
        v2(Address("10.1.2.3", 4000), Address("10.0.0.1", 1883), tlvs=tlv(1, b"h2") + tlv(4, b"")),
        ProxyHeader(2, 36, Address("10.1.2.3", 4000), Address("10.0.0.1", 1883)),
        id="v2-tlvs-skipped",
    ),
    pytest.param(v2(None, None, command=0), ProxyHeader(2, 16, None, None), id="v2-local"),
    pytest.param(
        v2(None, None, command=0, kind=0x11, block=bytes(12)),
        ProxyHeader(2, 28, None, None),
        id="v2-local-with-addresses-ignored",
    ),
    pytest.param(v2(None, None, kind=0x00), ProxyHeader(2, 16, None, None), id="v2-unspec"),
    pytest.param(
        v2(None, None, kind=0x31, block=b"/a".ljust(108, b"\0") + b"/b".ljust(108, b"\0")),
        ProxyHeader(2, 232, None, None),
        id="v2-unix-socket-peer-stands",
    ),
]


@pytest.mark.parametrize(("data", "header"), GOLDEN)
def test_golden_headers(data: bytes, header: ProxyHeader) -> None:
    assert parse_proxy_header(data) == header
    # The bytes after it are the proxied stream's, untouched.
    assert parse_proxy_header(data + CONNECT) == header
    assert all(parse_proxy_header(data[:n]) is None for n in range(len(data)))


REFUSED = [
    pytest.param(CONNECT, id="mqtt-without-header"),
    pytest.param(b"\x10", id="mqtt-first-byte-alone"),
    pytest.param(b"GET / HTTP/1.1\r\n", id="http"),
    pytest.param(b"PROXZ", id="v1-bad-prefix"),
    pytest.param(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", id="v1-lf-without-cr"),
    pytest.param(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\rX", id="v1-cr-without-lf"),
    pytest.param(b"PROXY TCP4 " + b"1" * 100, id="v1-no-crlf-in-107-bytes"),
    pytest.param(v1("TCP4", "01.2.3.4", "5.6.7.8", 1, 2), id="v1-heading-zero-address"),
    pytest.param(v1("TCP4", "1.2.3.4", "5.6.7.8", 1, 2).replace(b" 1 ", b" 01 "), id="v1-0port"),
    pytest.param(v1("TCP4", "1.2.3.4", "5.6.7.8", 65536, 2), id="v1-port-too-large"),
    pytest.param(v1("TCP4", "::1", "::1", 1, 2), id="v1-family-mismatch"),
    pytest.param(v1("TCP6", "fe80::1%eth0", "::1", 1, 2), id="v1-scoped-ipv6"),
    pytest.param(b"PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n", id="v1-two-spaces"),
    pytest.param(b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n", id="v1-unknown-family"),
    pytest.param(b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", id="v1-missing-port"),
    pytest.param(V2_SIGNATURE[:5] + b"X", id="v2-bad-signature"),
    pytest.param(V2_SIGNATURE + b"\x11\x11\x00\x00", id="v2-version-1"),
    pytest.param(V2_SIGNATURE + b"\x22\x11\x00\x00", id="v2-command-2"),
    pytest.param(V2_SIGNATURE + b"\x21\x41\x00\x00", id="v2-family-4"),
    pytest.param(V2_SIGNATURE + b"\x21\x13\x00\x00", id="v2-transport-3"),
    pytest.param(V2_SIGNATURE + b"\x21\x11\x02\x09", id="v2-longer-than-536"),
    pytest.param(V2_SIGNATURE + b"\x21\x11\x00\x04" + bytes(4), id="v2-short-address-block"),
]


@pytest.mark.parametrize("data", REFUSED)
def test_refused(data: bytes) -> None:
    with pytest.raises(ProxyProtocolError):
        parse_proxy_header(data)


def test_v2_bound_is_a_setting() -> None:
    header = v2(Address("10.0.0.9", 1), Address("10.0.0.1", 2), tlvs=tlv(0x05, bytes(1000)))
    with pytest.raises(ProxyProtocolError, match="exceeds 536"):
        parse_proxy_header(header)
    assert parse_proxy_header(header, max_v2_bytes=2048) is not None


ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)
ports = st.integers(0, 65535)


@st.composite
def headers(draw: st.DrawFn) -> tuple[bytes, Address, Address]:
    ip = draw(st.sampled_from([ipv4, ipv6]))
    src, dst = Address(draw(ip), draw(ports)), Address(draw(ip), draw(ports))
    if draw(st.booleans()):
        family = "TCP4" if ":" not in src.host else "TCP6"
        return v1(family, src.host, dst.host, src.port, dst.port), src, dst
    tlvs = draw(st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=40)), max_size=4))
    return v2(src, dst, tlvs=b"".join(tlv(k, v) for k, v in tlvs)), src, dst


@given(headers(), st.binary(max_size=64))
def test_round_trip(case: tuple[bytes, Address, Address], rest: bytes) -> None:
    data, src, dst = case
    header = parse_proxy_header(data + rest)
    assert header is not None
    assert (header.source, header.destination, header.length) == (src, dst, len(data))
    assert str(header.source) == f"{src.host}:{src.port}"


@given(headers())
def test_every_prefix_asks_for_more(case: tuple[bytes, Address, Address]) -> None:
    data = case[0]
    for n in range(len(data)):
        assert parse_proxy_header(data[:n]) is None


@given(st.binary(max_size=600))
def test_random_bytes_raise_only_the_parsers_error(data: bytes) -> None:
    try:
        header = parse_proxy_header(data)
    except ProxyProtocolError:
        return
    assert header is None or header.length <= len(data)


@given(st.sampled_from([b"PROXY ", V2_SIGNATURE]), st.binary(max_size=600))
def test_random_bytes_after_a_signature_raise_only_the_parsers_error(
    head: bytes, data: bytes
) -> None:
    try:
        header = parse_proxy_header(head + data)
    except ProxyProtocolError:
        return
    assert header is None or header.length <= len(head + data)
