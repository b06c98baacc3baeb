"""A local Redis Cluster for `starling up --redis cluster` and for tests: three (or more)
primaries, each optionally with replicas, on 127.0.0.1, made of the Debian `redis-server`
binary and formed with `redis-cli --cluster create`.

Owns: each cluster node's config text (`cluster_node_conf`), forming a cluster out of running
servers (`create_cluster`, which waits until every node reports `cluster_state:ok`), and the
processes of a cluster it starts itself (`start_cluster` -> `LocalCluster`). The launcher of
`starling up` may spawn the servers as its own children from `cluster_node_conf` and call
`create_cluster`; tests use `start_cluster`.

Nodes keep no data on disk (no RDB, no AOF), like the standalone local Redis: Starling keeps in
Redis only what it may lose. Each node's cluster config (`nodes.conf`) is kept in its folder, so
a node restarted there rejoins with its slots (empty), which is how a shard losing its data
looks to Starling (services/session/registry.py's per-tenant generation sentinel). Replicas
are promoted after `node_timeout_ms` without their primary; `cluster-require-full-coverage no`
keeps the other shards serving while one shard has no primary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from redis import Redis
from redis.exceptions import RedisError

from services.cli.infra import redis_binary
from services.cli.ports import free_port

DEFAULT_NODE_TIMEOUT_MS = 2000


def cluster_node_conf(
    *,
    port: int,
    bus_port: int,
    folder: Path,
    password: str,
    node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS,
) -> str:
    """One cluster node's redis.conf (a replica authenticates to its primary with the same
    password: `masterauth`). `bus_port`: its cluster bus port, picked like `port` (Redis's
    default, port + 10000, is a port nobody checked is free)."""
    return (
        f'port {port}\ncluster-port {bus_port}\nbind 127.0.0.1\ndir {folder}\nsave ""\n'
        "appendonly no\n"
        f"daemonize no\nrequirepass {password}\nmasterauth {password}\n"
        f"cluster-enabled yes\ncluster-config-file nodes-{port}.conf\n"
        f"cluster-node-timeout {node_timeout_ms}\ncluster-require-full-coverage no\n"
        "cluster-allow-reads-when-down no\n"
    )


def _cli() -> str:
    found = shutil.which("redis-cli")
    if not found:
        raise SystemExit("redis-cli not found: apt-get install redis-tools (or redis-server)")
    return found


def _cluster_ok(port: int, password: str) -> bool:
    try:
        with Redis(host="127.0.0.1", port=port, password=password, socket_timeout=2) as r:
            info = r.cluster("info")
    except RedisError:
        return False
    return bool(info.get("cluster_state") == "ok")


def wait_cluster_ok(*, ports: list[int], password: str, timeout_s: float = 30.0) -> None:
    """Wait until every node of `ports` reports `cluster_state:ok` (RuntimeError past
    `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    pending = list(ports)
    while pending:
        pending = [p for p in pending if not _cluster_ok(p, password)]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"redis cluster not ok on ports {pending} after {timeout_s}s")
        time.sleep(0.1)


def create_cluster(
    *, ports: list[int], password: str, replicas: int = 0, timeout_s: float = 30.0
) -> list[str]:
    """Form a cluster of the running servers on `ports` (`cluster-enabled yes`, empty):
    len(ports) / (replicas + 1) primaries share the 16384 slots, each with `replicas`
    replicas. Returns the seeds ("127.0.0.1:port") once every node reports
    `cluster_state:ok`. The password goes to redis-cli in its environment, never on its
    command line."""
    if len(ports) < 3 * (replicas + 1):
        raise ValueError("a cluster needs at least three primaries")
    argv = [_cli(), "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports)]
    argv += ["--cluster-replicas", str(replicas), "--cluster-yes"]
    env = {**os.environ, "REDISCLI_AUTH": password}
    done = subprocess.run(argv, env=env, capture_output=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-2000:]!r}")
    wait_cluster_ok(ports=ports, password=password, timeout_s=timeout_s)
    return [f"127.0.0.1:{p}" for p in ports]


@dataclass(frozen=True, slots=True)
class ClusterNode:
    port: int
    folder: Path
    process: subprocess.Popen[bytes]


@dataclass(frozen=True, slots=True)
class LocalCluster:
    """A cluster `start_cluster` started: its seeds and its nodes' processes."""

    seeds: list[str]
    password: str
    nodes: dict[int, ClusterNode]  # port -> node; `restart` replaces an entry

    def primary_ports(self) -> list[int]:
        """Ports of the nodes that are primaries now (a failover changes them)."""
        out = []
        for port in self.nodes:
            try:
                with Redis(host="127.0.0.1", port=port, password=self.password) as r:
                    if r.info("replication").get("role") == "master":
                        out.append(port)
            except RedisError:
                continue  # down
        return sorted(out)

    def kill(self, port: int) -> None:
        """SIGKILL one node (its data is gone; its nodes.conf stays)."""
        node = self.nodes[port]
        node.process.kill()
        node.process.wait(10)

    def restart(self, port: int) -> None:
        """Start a killed node again in its folder: it rejoins with its cluster config."""
        node = self.nodes[port]
        self.nodes[port] = ClusterNode(port, node.folder, _spawn(node.folder))

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.process.poll() is None:
                node.process.terminate()
        for node in self.nodes.values():
            try:
                node.process.wait(10)
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait(10)


def _spawn(folder: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [redis_binary(), str(folder / "redis.conf")],
        stdout=open(folder / "redis.log", "ab"),  # the child holds it
        stderr=subprocess.STDOUT,
    )


def _wait_ping(port: int, password: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server on port {port} exited with {proc.returncode}")
        try:
            with Redis(host="127.0.0.1", port=port, password=password, socket_timeout=1) as r:
                if r.ping():
                    return
        except RedisError:
            time.sleep(0.05)
    raise RuntimeError(f"redis-server on port {port} did not answer")


def start_cluster(
    *,
    folder: Path,
    password: str,
    ports: list[int],
    replicas: int = 0,
    node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS,
) -> LocalCluster:
    """Start one redis-server per port (in `folder`/<port>) and form a cluster of them
    (`create_cluster`); call `stop()` on the result when done."""
    nodes: dict[int, ClusterNode] = {}
    try:
        for port in ports:
            node_dir = folder / str(port)
            node_dir.mkdir(parents=True, exist_ok=True)
            conf = cluster_node_conf(
                port=port,
                bus_port=free_port(),
                folder=node_dir,
                password=password,
                node_timeout_ms=node_timeout_ms,
            )
            (node_dir / "redis.conf").write_text(conf)
            (node_dir / "redis.conf").chmod(0o600)
            nodes[port] = ClusterNode(port, node_dir, _spawn(node_dir))
        for node in nodes.values():
            _wait_ping(node.port, password, node.process)
        seeds = create_cluster(ports=ports, password=password, replicas=replicas)
    except BaseException:
        LocalCluster([], password, nodes).stop()
        raise
    return LocalCluster(seeds, password, nodes)
