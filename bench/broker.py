"""The brokers a bench measures: the `Broker` handle (its port, its processes, how to stop
it), a Starling mesh started as `starling up` would, and waiting for a broker to go quiet
between scenarios. Mosquitto's side is bench/mosquitto.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.machine import cpu_seconds
from services.cli.launcher import Launcher
from services.quota.client import Limits, QuotaAdminClient

BENCH_TENANT = "default"  # where the load generator's anonymous clients land


@dataclass
class Broker:
    name: str
    port: int
    pid: int  # the process taking the MQTT connections (Starling: node connection-0)
    stop: Callable[[], None]
    second_port: int = 0  # another node of the same mesh (Starling only)
    others: list[int] = field(default_factory=list)  # every other process of the broker
    # Starling only: set the bench tenant's publish limits (msg/s, bytes/s; 0 lifts them).
    set_limits: Callable[[int, int], Awaitable[None]] | None = None

    @property
    def pids(self) -> list[int]:
        return [self.pid, *self.others]


def starling_launcher(
    folder: Path,
    nodes: int = 2,
    node_workers: int = 1,
    env: dict[str, str] | None = None,
    instances: dict[str, int] | None = None,
    redis: str = "standalone",
) -> Launcher:
    """The mesh every bench runs: `starling up`'s services, quiet logs, no cap per IP;
    `env`: further settings (STARLING_...); `instances`: back-office instances (default 1
    each); `redis`: the local Redis (standalone, sentinel, cluster)."""
    return Launcher(
        data_dir=folder,
        nodes=nodes,
        mqtt_port=0,
        ws=False,
        node_workers=node_workers,
        instances=instances,
        redis=redis,
        extra_env={
            "STARLING_LOG_LEVEL": "WARNING",
            "STARLING_MAX_QUEUED_MESSAGES": "100000",
            # Every bench client comes from 127.0.0.1: no cap per address.
            "STARLING_MAX_CONNECTIONS_PER_IP": "0",
            **(env or {}),
        },
    )


def start_starling(
    folder: Path, nodes: int = 2, node_workers: int = 1, env: dict[str, str] | None = None
) -> Broker:
    launcher = starling_launcher(folder, nodes, node_workers, env)
    mesh = launcher.start()
    node = mesh.by_name("connection-0")
    quota_addr = f"127.0.0.1:{mesh.by_name('quota').grpc_port}"

    async def set_limits(messages_per_s: int, bytes_per_s: int) -> None:
        client = QuotaAdminClient(quota_addr, launcher.secrets.admin_token)
        limits = Limits(max_messages_per_s=messages_per_s, max_bytes_in_per_s=bytes_per_s)
        await client.set_limits(BENCH_TENANT, limits)

    return Broker(
        "Starling",
        node.port,
        node.pid,
        launcher.stop,
        mesh.by_name("connection-1").port if nodes > 1 else 0,
        [c.pid for c in mesh.components if c.pid and c.pid != node.pid],
        set_limits,
    )


async def settle(b: Broker, limit_s: float = 15.0, cores: float = 0.1) -> None:
    """Wait (at most `limit_s`) until the broker's processes use less than `cores` of CPU, so
    one scenario's aftermath (e.g. 10,000 disconnects) does not land in the next one."""
    deadline = time.monotonic() + limit_s
    prev, t = sum(map(cpu_seconds, b.pids)), time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now, t2 = sum(map(cpu_seconds, b.pids)), time.monotonic()
        if (now - prev) / (t2 - t) < cores:
            return
        prev, t = now, t2
    print(f"  {b.name:<16} still busy after {limit_s:.0f} s: measuring anyway", flush=True)
