"""Network namespaces as the hosts of a test network, and the partitions between them.

`Network` owns one Linux bridge in the root namespace (the "switch", which also has an
address, so this process and HAProxy reach every host) and one namespace per host, each
joined to the bridge by a veth pair and given one address of a private /24 picked at
random from 10.231.0.0/16 among those no interface uses. Names carry a random tag and the
creating process's pid (`stp-<tag>-<pid>-<host>`), so parallel runs do not clash and
`sweep_leftovers` can remove what a killed run left behind.

Partitions, each undone by its counterpart:
- `cut(host)` / `heal(host)`: the host's link down / up: it reaches nothing and nothing
  reaches it (its processes keep running, as on a host whose cable was pulled);
- `block(host, peers, ports)` / `unblock(host)`: nftables rules inside the host's namespace
  drop its TCP traffic to and from `ports` on `peers` (both directions, loopback included),
  so the host is cut off from some services while everything else still reaches it.
`close()` removes every namespace, link and rule; call it in a `finally`.
"""

from __future__ import annotations

import ipaddress
import os
import random
import re
import secrets
import subprocess
from dataclasses import dataclass

PREFIX = "stp-"
SUBNETS = ipaddress.ip_network("10.231.0.0/16")


class NetnsUnavailableError(Exception):
    """Namespaces cannot be made here (not root, no `ip`, a kernel or sandbox that refuses)."""


def ip(*args: str, ns: str = "") -> str:
    """Run `ip ARGS` (in namespace `ns`); its stdout; CalledProcessError on failure."""
    cmd = ["ip", "netns", "exec", ns, "ip", *args] if ns else ["ip", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=10).stdout


def nft(ns: str, script: str) -> None:
    """Load an nftables script into namespace `ns`."""
    subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "-f", "-"],
        input=script,
        check=True,
        capture_output=True,
        text=True,
        timeout=10,
    )


def unavailable() -> str:
    """Why this machine cannot run the partition suite ("" when it can): a namespace, a
    veth pair and an nftables rule inside the namespace are all tried."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"{PREFIX}probe-{os.getpid()}-{secrets.token_hex(2)}"
    try:
        ip("netns", "add", name)
        try:
            ip("link", "add", "stprobe0", "type", "veth", "peer", "name", "stprobe1", ns=name)
            nft(
                name,
                "table inet probe {\n chain o {\n type filter hook output priority 0;\n }\n}\n",
            )
        finally:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        return f"cannot create network namespaces here: {str(detail).strip()}"
    return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers() -> list[str]:
    """Remove namespaces and bridges of earlier runs whose process is gone; what went."""
    removed = []
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        m = re.match(rf"({PREFIX}(\w+)-(\d+)-\S+)", line)
        if m and not _pid_alive(int(m.group(3))):
            subprocess.run(["ip", "netns", "del", m.group(1)], capture_output=True)
            removed.append(m.group(1))
            bridge = f"stb{m.group(2)}"
            subprocess.run(["ip", "link", "del", bridge], capture_output=True)
    return removed


def _free_subnet() -> ipaddress.IPv4Network:
    used = ip("-4", "-o", "addr", "show")
    taken = {ipaddress.ip_interface(a).network for a in re.findall(r"inet (\S+)", used)}
    candidates = [n for n in SUBNETS.subnets(new_prefix=24) if n not in taken]
    candidates = [n for n in candidates if not any(n.overlaps(t) for t in taken)]
    return ipaddress.IPv4Network(random.choice(candidates[1:]))


@dataclass(frozen=True, slots=True)
class Host:
    name: str  # "nats-1", "node-0", ...: the test's name for it
    ns: str  # its namespace
    address: str  # its one address
    link: str  # the root end of its veth pair (on the bridge)


class Network:
    """A bridge and the hosts on it; `close()` removes them all."""

    def __init__(self) -> None:
        self.tag = secrets.token_hex(3)
        self.bridge = f"stb{self.tag}"
        self.subnet = _free_subnet()
        self._addresses = iter(self.subnet.hosts())
        self.gateway = str(next(self._addresses))  # the bridge's own address
        self.hosts: dict[str, Host] = {}
        self._blocked: set[str] = set()
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def add(self, name: str) -> Host:
        """A new host on the bridge, its loopback and link up."""
        index = len(self.hosts)
        ns = f"{PREFIX}{self.tag}-{os.getpid()}-{name}"
        link, peer = f"st{self.tag}v{index}", f"st{self.tag}p{index}"
        address = str(next(self._addresses))
        ip("netns", "add", ns)
        host = Host(name, ns, address, link)
        self.hosts[name] = host
        ip("link", "add", link, "type", "veth", "peer", "name", peer)
        ip("link", "set", peer, "netns", ns)
        ip("link", "set", link, "master", self.bridge)
        ip("link", "set", link, "up")
        ip("addr", "add", f"{address}/24", "dev", peer, ns=ns)
        ip("link", "set", peer, "up", ns=ns)
        ip("link", "set", "lo", "up", ns=ns)
        return host

    def exec_prefix(self, host: str) -> list[str]:
        """The command prefix that runs a program on `host`."""
        return ["ip", "netns", "exec", self.hosts[host].ns]

    def cut(self, host: str) -> None:
        """Pull the host's cable: its link down."""
        ip("link", "set", self.hosts[host].link, "down")

    def heal(self, host: str) -> None:
        ip("link", "set", self.hosts[host].link, "up")

    def block(self, host: str, peers: list[str], ports: list[int]) -> None:
        """Drop `host`'s TCP traffic with `peers` (hosts' names) on `ports`, whichever side
        listens, both ways: no packet gets through and nothing answers (connections hang, as
        in a partition)."""
        addrs = ", ".join(self.hosts[p].address for p in peers)
        plist = ", ".join(str(p) for p in ports)
        out = (
            f"ip daddr {{ {addrs} }} tcp dport {{ {plist} }} drop\n"
            f"    ip daddr {{ {addrs} }} tcp sport {{ {plist} }} drop\n"
        )
        into = (
            f"ip saddr {{ {addrs} }} tcp sport {{ {plist} }} drop\n"
            f"    ip saddr {{ {addrs} }} tcp dport {{ {plist} }} drop\n"
        )
        nft(
            self.hosts[host].ns,
            "table inet partition {\n"
            f"  chain out {{ type filter hook output priority 0;\n    {out}  }}\n"
            f"  chain in {{ type filter hook input priority 0;\n    {into}  }}\n"
            "}\n",
        )
        self._blocked.add(host)

    def unblock(self, host: str) -> None:
        if host in self._blocked:
            nft(self.hosts[host].ns, "delete table inet partition\n")
            self._blocked.discard(host)

    def close(self) -> None:
        """Remove every namespace and link of this network (errors ignored: best effort)."""
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.ns], capture_output=True, timeout=10)
            subprocess.run(["ip", "link", "del", host.link], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=10)
        self.hosts.clear()
