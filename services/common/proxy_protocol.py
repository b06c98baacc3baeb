"""The PROXY protocol header (HAProxy's proxy-protocol.txt, versions 1 and 2): a load balancer
in TCP mode sends it first on each connection it opens to a node, naming the client's real
address. Sans-I/O: bytes in, a `ProxyHeader` (or "need more") out; no asyncio.

Call `parse_proxy_header(buffer)` with everything received so far: None asks for more bytes,
a `ProxyHeader` says how many leading bytes it took (`length`), and anything that is not a
valid header raises `ProxyProtocolError` as soon as the bytes show it (a client speaking MQTT
straight away fails on its first byte). The caller closes such a connection at once, as the
spec asks.

Invariants:
- bounded: version 1 must end its line within 107 bytes (CRLF included); version 2 may
  announce at most `max_v2_bytes` in all (536 by default, the smallest TCP segment every host
  must accept, which the spec designs the header to fit);
- every strict prefix of a valid header asks for more, never raises;
- `source` None means "use the socket's own addresses": a v2 LOCAL command (the proxy's own
  health check), a v1 UNKNOWN line, or a v2 family/transport the node does not use (UNSPEC,
  AF_UNIX, datagrams), which the spec lets a receiver treat as UNSPEC. TLVs are skipped.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

V1_PREFIX = b"PROXY "
V1_MAX_BYTES = 107  # "PROXY UNKNOWN <ipv6> <ipv6> 65535 65535\r\n"
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V2_FIXED_BYTES = 16  # signature, version/command, family/transport, length
V2_DEFAULT_MAX_BYTES = 536

_V2_LOCAL, _V2_PROXY = 0x0, 0x1
_AF_UNSPEC, _AF_INET, _AF_INET6, _AF_UNIX = 0x0, 0x1, 0x2, 0x3
_UNSPEC, _STREAM, _DGRAM = 0x0, 0x1, 0x2
# Address block bytes per family: two addresses, then two ports (INET, INET6).
_V2_ADDRESS_BYTES = {_AF_UNSPEC: 0, _AF_INET: 12, _AF_INET6: 36, _AF_UNIX: 216}


class ProxyProtocolError(ValueError):
    """The bytes are not a valid PROXY protocol header (or exceed its bounds)."""


@dataclass(frozen=True, slots=True)
class Address:
    host: str  # an IP address as text: "192.0.2.7", "2001:db8::1"
    port: int

    def __str__(self) -> str:
        """The form connection nodes report peers in: "ip:port" (IPv6 without brackets)."""
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    version: int  # 1 or 2
    length: int  # bytes of the header; what follows belongs to the proxied stream
    source: Address | None  # None: use the socket's own peer (LOCAL, UNKNOWN, unsupported)
    destination: Address | None


def parse_proxy_header(data: bytes, max_v2_bytes: int = V2_DEFAULT_MAX_BYTES) -> ProxyHeader | None:
    """The header at the start of `data`; None while `data` is a strict prefix of one."""
    if not data:
        return None
    if data[0] == V1_PREFIX[0]:
        return _parse_v1(data)
    if data[0] == V2_SIGNATURE[0]:
        return _parse_v2(data, max_v2_bytes)
    raise ProxyProtocolError("no PROXY protocol header")


def _parse_v1(data: bytes) -> ProxyHeader | None:
    head = data[: len(V1_PREFIX)]
    if not V1_PREFIX.startswith(head):
        raise ProxyProtocolError("not a PROXY protocol v1 line")
    end = data.find(b"\n", 0, V1_MAX_BYTES)
    if end < 0:
        bad = data.find(b"\r", 0, V1_MAX_BYTES)
        if 0 <= bad < len(data) - 1:  # a CR not followed by LF
            raise ProxyProtocolError("v1 line has a CR without LF")
        if len(data) >= V1_MAX_BYTES:
            raise ProxyProtocolError(f"v1 line longer than {V1_MAX_BYTES} bytes")
        return None
    if end < len(V1_PREFIX) or data[end - 1] != 0x0D:
        raise ProxyProtocolError("v1 line must end with CRLF")
    line = data[: end - 1]
    if b"\r" in line:
        raise ProxyProtocolError("v1 line has a CR without LF")
    return _v1_fields(line.decode("ascii", errors="replace"), end + 1)


def _v1_fields(line: str, length: int) -> ProxyHeader:
    parts = line.split(" ")
    family = parts[1]
    if family == "UNKNOWN":  # the receiver ignores the rest of the line
        return ProxyHeader(version=1, length=length, source=None, destination=None)
    if family not in ("TCP4", "TCP6") or len(parts) != 6:
        raise ProxyProtocolError("v1 line must be PROXY TCP4|TCP6 src dst sport dport")
    want = ipaddress.IPv4Address if family == "TCP4" else ipaddress.IPv6Address
    if "%" in parts[2] or "%" in parts[3]:  # ipaddress takes a scope; the spec does not
        raise ProxyProtocolError("v1 address with a scope")
    try:
        src, dst = want(parts[2]), want(parts[3])
    except ValueError:
        raise ProxyProtocolError(f"v1 addresses are not {family}") from None
    sport, dport = _v1_port(parts[4]), _v1_port(parts[5])
    return ProxyHeader(
        version=1,
        length=length,
        source=Address(str(src), sport),
        destination=Address(str(dst), dport),
    )


def _v1_port(text: str) -> int:
    # Decimal in [0, 65535], no heading zeroes (proxy-protocol.txt 2.1).
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0"):
        raise ProxyProtocolError("v1 port is not a decimal number without heading zeroes")
    port = int(text)
    if port > 65535:
        raise ProxyProtocolError("v1 port over 65535")
    return port


def _parse_v2(data: bytes, max_v2_bytes: int) -> ProxyHeader | None:
    sig = data[: len(V2_SIGNATURE)]
    if not V2_SIGNATURE.startswith(sig):
        raise ProxyProtocolError("not a PROXY protocol v2 signature")
    if len(data) > 12 and data[12] >> 4 != 0x2:
        raise ProxyProtocolError("v2 header of another version")
    if len(data) > 12 and data[12] & 0x0F not in (_V2_LOCAL, _V2_PROXY):
        raise ProxyProtocolError("v2 command is neither LOCAL nor PROXY")
    if len(data) > 13:
        family, transport = data[13] >> 4, data[13] & 0x0F
        if family not in _V2_ADDRESS_BYTES or transport not in (_UNSPEC, _STREAM, _DGRAM):
            raise ProxyProtocolError("v2 address family or transport unknown")
    if len(data) < V2_FIXED_BYTES:
        return None
    (size,) = struct.unpack_from("!H", data, 14)
    length = V2_FIXED_BYTES + size
    if length > max_v2_bytes:
        raise ProxyProtocolError(f"v2 header of {length} bytes exceeds {max_v2_bytes}")
    if len(data) < length:
        return None
    return _v2_addresses(data[V2_FIXED_BYTES:length], data[12] & 0x0F, data[13], length)


def _v2_addresses(block: bytes, command: int, kind: int, length: int) -> ProxyHeader:
    family, transport = kind >> 4, kind & 0x0F
    if command == _V2_LOCAL:  # the family is ignored; the block skipped
        return ProxyHeader(version=2, length=length, source=None, destination=None)
    if len(block) < _V2_ADDRESS_BYTES[family]:
        raise ProxyProtocolError("v2 address block shorter than its family needs")
    if family not in (_AF_INET, _AF_INET6) or transport != _STREAM:
        # UNSPEC, AF_UNIX, datagrams: no IP client to name; the socket's own peer stands.
        return ProxyHeader(version=2, length=length, source=None, destination=None)
    n = 4 if family == _AF_INET else 16
    ip = ipaddress.IPv4Address if family == _AF_INET else ipaddress.IPv6Address
    sport, dport = struct.unpack_from("!HH", block, 2 * n)
    return ProxyHeader(
        version=2,
        length=length,
        source=Address(str(ip(block[:n])), sport),
        destination=Address(str(ip(block[n : 2 * n])), dport),
    )
