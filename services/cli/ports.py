"""Free-port picking for local meshes.

Ports come from below the kernel's ephemeral range (net.ipv4.ip_local_port_range), which
outgoing connections use for their source ports: a port handed out by the kernel for
`bind(0)` could otherwise be taken by some component's outgoing connection before the child
process that should listen on it binds it. Each candidate is test-bound before it is
handed out, and never handed out twice by one process. `STARLING_PORT_RANGE` ("low-high")
narrows the range, so processes that pick ports side by side (parallel test workers) never
pick the same one.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def default_range() -> tuple[int, int]:
    """The ports free_port picks from when STARLING_PORT_RANGE does not narrow them."""
    high = min(_ephemeral_low(), 32768) - 1
    return (10000 if high > 12000 else 1024), high


def _range() -> tuple[int, int]:
    asked = os.environ.get("STARLING_PORT_RANGE", "")
    if asked:
        low, _, high = asked.partition("-")
        return int(low), int(high)
    return default_range()


def free_port(host: str = "127.0.0.1") -> int:
    low, high = _range()
    for _ in range(200):
        port = random.randint(low, high)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # fall back to the kernel
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
