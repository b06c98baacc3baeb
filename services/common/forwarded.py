"""The client address of an HTTP request (a WebSocket upgrade) that came through proxies the
operator trusts: `Forwarded: for=` (RFC 7239), or else `X-Forwarded-For`. Pure: the listener
hands in the socket's peer and the header values; no I/O.

Theory of operation: each proxy appends the address it received the request from, so the
list reads client, proxy 1, ..., proxy n-1, and the socket's peer is proxy n. Only entries
appended by trusted proxies can be believed; anything to their left may be made up by the
client. So the list is walked from the right, past trusted addresses, and the first
untrusted one is the client. A socket peer that is not trusted means the headers are the
client's own words: they are ignored. An entry that is not an IP address (`unknown`, an
obfuscated identifier, garbage) ends the walk: the nearest address known, a trusted proxy,
stands.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_ip(text: str) -> IpAddress | None:
    """An address as forwarding headers and sockets write it: "192.0.2.7", "2001:db8::1",
    "[2001:db8::1]:4711", "192.0.2.7:4711"; IPv4-mapped IPv6 as IPv4. None: not an IP."""
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1 : text.find("]")] if "]" in text else ""
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    if "%" in text:
        return None  # scoped IPv6: not an address another host could reach us from
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


@dataclass(frozen=True, slots=True)
class TrustedProxies:
    networks: tuple[IpNetwork, ...] = ()

    @classmethod
    def parse(cls, cidrs: Iterable[str]) -> TrustedProxies:
        """From CIDRs ("10.0.0.0/8", "2001:db8::/32"; a bare address is a /32 or /128);
        ValueError naming the first that is not one."""
        networks = []
        for cidr in cidrs:
            try:
                networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
            except ValueError:
                raise ValueError(f"not an IP network (CIDR): {cidr!r}") from None
        return cls(tuple(networks))

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, ip: IpAddress) -> bool:
        return any(ip.version == n.version and ip in n for n in self.networks)


def split_x_forwarded_for(values: Iterable[str]) -> list[str]:
    """The entries of every `X-Forwarded-For` header line, in order."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def client_address(
    peer: str,
    trusted: TrustedProxies,
    forwarded_for: Sequence[str | None] = (),
    x_forwarded_for: Sequence[str] = (),
) -> str:
    """The client's address for a request whose socket peer is `peer` (an IP as text).
    `forwarded_for`: the `for=` of each `Forwarded` element in order (None: the element
    had none); used when there is any, else `x_forwarded_for` (split_x_forwarded_for)."""
    nearest = parse_ip(peer)
    if nearest is None or not trusted.trusts(nearest):
        return peer
    hops: Sequence[str | None] = (
        forwarded_for if any(f is not None for f in forwarded_for) else x_forwarded_for
    )
    for hop in reversed(hops):
        ip = parse_ip(hop) if hop is not None else None
        if ip is None:
            break
        nearest = ip
        if not trusted.trusts(ip):
            break
    return str(nearest)
