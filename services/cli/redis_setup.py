"""Which local Redis a mesh of `starling up` runs on (`--redis standalone|sentinel|cluster`):
starts its processes as children of the launcher and says which settings point the services
at it and when it is ready.

- standalone: one redis-server (`redis`), as always;
- sentinel: a primary and two replicas (`redis`, `redis-1`, `redis-2`) and three Sentinels
  (`sentinel`, `sentinel-1`, `sentinel-2`), services/cli/redis_sentinel.py;
- cluster: three primaries (`redis`, `redis-1`, `redis-2`) formed into a Redis Cluster by
  services/cli/redis_cluster.py once they answer.

Every process is a component of kind "redis" in mesh.json, stopped after the services and
restarted by the supervisor like any other child.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from services.cli import redis_sentinel
from services.cli.infra import redis_binary, redis_conf
from services.cli.mesh import Component
from services.cli.ports import free_port, port_open
from services.cli.secrets import write_private

REDIS_MODES = ("standalone", "sentinel", "cluster")

Spawn = Callable[[Component, list[str]], None]


@dataclass(slots=True)
class LocalRedis:
    """A started local Redis: its components (the first one is the primary at start), the
    settings the services get, and `ready()` (polled by the launcher; a cluster is formed
    by the first call that finds every node answering)."""

    mode: str
    password: str
    components: list[Component]
    env: dict[str, str] = field(default_factory=dict)
    sentinel_ports: redis_sentinel.SentinelPorts | None = None
    formed: list[str] = field(default_factory=list)  # a cluster's seeds once formed

    def ready(self) -> bool:
        if not all(port_open("127.0.0.1", c.port) for c in self.components):
            return False
        if self.sentinel_ports is not None:
            return redis_sentinel.sentinel_ready(self.sentinel_ports, self.password)
        if self.mode == "cluster" and not self.formed:
            from services.cli.redis_cluster import create_cluster

            self.formed = create_cluster(
                ports=[c.port for c in self.components], password=self.password
            )
        return True


def check_redis_mode(mode: str) -> str:
    if mode not in REDIS_MODES:
        raise ValueError(f"redis (--redis) must be one of {', '.join(REDIS_MODES)}, not {mode!r}")
    return mode


def _server(spawn: Spawn, data_dir: Path, name: str, conf_text: str, port: int) -> Component:
    comp = Component(name, "redis", port=port)
    # The password goes in a 0600 file: a command line is visible to every local user.
    conf = data_dir / f"{name}.conf"
    write_private(conf, conf_text)
    spawn(comp, [redis_binary(), str(conf)])
    return comp


def start_local_redis(*, mode: str, spawn: Spawn, data_dir: Path, password: str) -> LocalRedis:
    """Start the processes of `mode` through `spawn`; the caller waits for `ready()`."""
    check_redis_mode(mode)
    if mode == "sentinel":
        return _start_sentinel(spawn, data_dir, password)
    names = ["redis"] if mode == "standalone" else ["redis", "redis-1", "redis-2"]
    comps = []
    for name in names:
        folder, port = data_dir / name, free_port()
        folder.mkdir(parents=True, exist_ok=True)
        if mode == "cluster":
            from services.cli.redis_cluster import cluster_node_conf

            text = cluster_node_conf(
                port=port, bus_port=free_port(), folder=folder, password=password
            )
        else:
            text = redis_conf(port=port, folder=folder, password=password)
        comps.append(_server(spawn, data_dir, name, text, port))
    env: dict[str, str] = {}
    if mode == "cluster":
        seeds = [f"127.0.0.1:{c.port}" for c in comps]
        env = {"STARLING_REDIS_MODE": "cluster", "STARLING_REDIS_CLUSTER_NODES": json.dumps(seeds)}
    return LocalRedis(mode, password, comps, env)


def _start_sentinel(spawn: Spawn, data_dir: Path, password: str) -> LocalRedis:
    ports = redis_sentinel.SentinelPorts(
        primary=free_port(),
        replicas=(free_port(), free_port()),
        sentinels=(free_port(), free_port(), free_port()),
    )
    comps = []
    servers = [("redis", ports.primary, 0)]
    servers += [(f"redis-{i + 1}", p, ports.primary) for i, p in enumerate(ports.replicas)]
    for name, port, primary in servers:
        folder = data_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        text = redis_sentinel.server_conf(
            port=port, folder=str(folder), password=password, primary=primary
        )
        comps.append(_server(spawn, data_dir, name, text, port))
    for i, port in enumerate(ports.sentinels):
        name = "sentinel" if i == 0 else f"sentinel-{i}"
        folder = data_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        comp = Component(name, "redis", port=port)
        conf = data_dir / f"{name}.conf"
        write_private(
            conf,
            redis_sentinel.sentinel_conf(
                port=port, folder=str(folder), password=password, primary=ports.primary
            ),
        )
        spawn(comp, [redis_binary(), str(conf), "--sentinel"])
        comps.append(comp)
    env = {**redis_sentinel.sentinel_env(ports), "STARLING_REDIS_SENTINEL_PASSWORD": password}
    return LocalRedis("sentinel", password, comps, env, sentinel_ports=ports)
