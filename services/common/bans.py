"""The ban list as every holder of a copy sees it (session services check it at CONNECT,
connection nodes kick connected clients it names): bans by client id, user or IP/CIDR, with
an expiry, and the matching rules. Pure data and matching; no I/O.

Matching rules:
- client id and user bans belong to one tenant (a user is the name within its tenant, as in
  `tenant/name`); an address ban with an empty tenant applies to every tenant.
- addresses are compared as IP networks: a single address is a /32 (/128) network; a peer
  written as IPv4-mapped IPv6 (`::ffff:10.0.0.1`, a dual-stack listener) matches the IPv4
  bans of its IPv4 address, and an IPv4-mapped ban value is stored as its IPv4 form.
- an expired ban matches nothing (holders drop it on their next change or sync).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from enum import IntEnum

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class BanKind(IntEnum):
    """Values of `starling.quota.v1.BanKind`."""

    CLIENT_ID = 1
    USERNAME = 2
    ADDRESS = 3


KIND_NAMES = {"client-id": BanKind.CLIENT_ID, "user": BanKind.USERNAME, "address": BanKind.ADDRESS}


@dataclass(frozen=True, slots=True, kw_only=True)
class Ban:
    kind: BanKind
    tenant: str
    value: str
    reason: str = ""
    expires_at_ms: int = 0  # 0: until removed
    created_at_ms: int = 0
    source: str = "operator"  # or "flapping"

    @property
    def key(self) -> tuple[int, str, str]:
        return (int(self.kind), self.tenant, self.value)

    def active(self, now_ms: int) -> bool:
        return not self.expires_at_ms or self.expires_at_ms > now_ms


def parse_network(value: str) -> IpNetwork:
    """An IP address or CIDR block as a network (ValueError if it is neither); IPv4-mapped
    IPv6 becomes IPv4."""
    net = ipaddress.ip_network(value.strip(), strict=False)
    if isinstance(net, ipaddress.IPv6Network) and net.prefixlen >= 96:
        mapped = net.network_address.ipv4_mapped
        if mapped is not None:
            return ipaddress.ip_network(f"{mapped}/{net.prefixlen - 96}", strict=False)
    return net


def normalized(ban: Ban) -> Ban:
    """`ban` with its value in canonical form (an address as its network); ValueError when
    it cannot be a ban (empty value, bad address, tenantless client id or user)."""
    value = ban.value.strip()
    if not value:
        raise ValueError("value is required")
    if ban.kind is BanKind.ADDRESS:
        value = str(parse_network(value))
    elif not ban.tenant:
        raise ValueError("a client id or user ban needs a tenant")
    return replace(ban, value=value)


def peer_ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP of a peer address as nodes report it: "ip:port" (TCP, TLS; IPv6 "::1:5000",
    the port after the last colon), "[v6]:port", "ws:ip" (WebSocket, no port) or a bare
    IP; None when it is not an IP (a test's fake peer)."""
    if address.startswith("ws:"):
        candidates = [address[3:]]
    elif address.startswith("["):
        candidates = [address[1 : address.find("]")]]
    else:
        host, sep, _port = address.rpartition(":")
        candidates = [host, address] if sep else [address]
    for c in candidates:
        try:
            return _unmapped(ipaddress.ip_address(c))
        except ValueError:
            continue
    return None


def _unmapped(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class BanList:
    """A holder's copy of the ban list, indexed for the CONNECT check."""

    def __init__(self, bans: list[Ban] | None = None) -> None:
        self._exact: dict[tuple[int, str, str], Ban] = {}
        self._networks: list[tuple[IpNetwork, Ban]] = []
        self.replace(bans or [])

    def replace(self, bans: list[Ban]) -> None:
        exact: dict[tuple[int, str, str], Ban] = {}
        networks: list[tuple[IpNetwork, Ban]] = []
        for ban in bans:
            if ban.kind is BanKind.ADDRESS:
                try:
                    networks.append((parse_network(ban.value), ban))
                except ValueError:
                    continue  # written by a newer version, perhaps: not ours to enforce
            else:
                exact[ban.key] = ban
        self._exact, self._networks = exact, networks

    def __len__(self) -> int:
        return len(self._exact) + len(self._networks)

    def match(
        self, tenant: str, client_id: str, username: str, peer: str, now_ms: int
    ) -> Ban | None:
        """The ban in force that names this client (its client id, its user name within
        `tenant`, or its peer address), if any."""
        for key in ((BanKind.CLIENT_ID, tenant, client_id), (BanKind.USERNAME, tenant, username)):
            if not key[2]:
                continue
            ban = self._exact.get((int(key[0]), key[1], key[2]))
            if ban is not None and ban.active(now_ms):
                return ban
        if self._networks:
            ip = peer_ip(peer)
            if ip is not None:
                for net, ban in self._networks:
                    if (
                        ip.version == net.version
                        and ip in net
                        and (not ban.tenant or ban.tenant == tenant)
                        and ban.active(now_ms)
                    ):
                        return ban
        return None
