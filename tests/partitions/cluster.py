"""A Starling mesh spread over the hosts of a `Network`, with HAProxy in front of its nodes.

Hosts (one namespace each, one address each):

| host | runs |
|---|---|
| redis | redis-server |
| nats-0, nats-1, nats-2 | one nats-server each: a cluster (routes, JetStream, R3 streams) |
| office | session, router, rules, quota, metrics |
| queue-0, queue-1 | one queue instance each (partitions leased in Redis) |
| node-0, node-1 | one connection node each (PROXY protocol v2 from HAProxy) |

The embedded store is one SQLite file under the run's folder, shared by the queue
instances as a database server would be (namespaces split the network, not the file
system). HAProxy runs in the root namespace on 127.0.0.1 (where the test clients are) and
balances over the nodes with `send-proxy-v2`, checking each every 0.5 s (a TCP connect,
sent a PROXY header too): a node that closes its listeners leaves the pool.

Every process runs as `ip netns exec <host> python -m services.cli.deathsig <pid> ...`, so
it dies with the test process even when that one is killed. `Cluster.close()` stops them
all (SIGTERM, then SIGKILL) and removes the network.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from services.cli.infra import nats_binary, redis_binary
from services.cli.ports import free_port, port_open
from services.cli.profiles import DEVELOPMENT, profile_settings
from services.cli.secrets import (
    NATS_USER_OF,
    MeshSecrets,
    nats_authorization,
    nats_cluster,
    nats_limits,
    write_private,
)
from services.common.rpc.server import check_health
from tests.partitions.netns import Network, sweep_leftovers
from tests.poll import wait_until

ROOT = str(Path(__file__).resolve().parent.parent.parent)
NATS_HOSTS = ("nats-0", "nats-1", "nats-2")
NODES = ("node-0", "node-1")
QUEUES = ("queue-0", "queue-1")
OFFICE = ("session", "router", "rules", "quota", "metrics")
HOSTS = ("redis", *NATS_HOSTS, "office", *QUEUES, *NODES)
GRPC_PORT = {
    "session": 7001,
    "router": 7002,
    "queue": 7003,
    "rules": 7004,
    "quota": 7005,
    "metrics": 7006,
    "connection": 7010,
}
NATS_PORT, ROUTE_PORT, MONITOR_PORT, REDIS_PORT, MQTT_PORT = 4222, 6222, 8222, 6379, 1883


@dataclass(frozen=True, slots=True)
class Proc:
    name: str  # the component: "nats-0", "redis", "router", "queue-1", "node-0", "haproxy"
    host: str  # the Network host it runs on ("" for the root namespace)
    service: str  # the Starling service, or "nats" / "redis" / "haproxy"
    grpc: str  # its gRPC address ("" for infrastructure)
    popen: subprocess.Popen[bytes]
    log: Path


@dataclass
class Cluster:
    """The processes of the mesh on `net`; built by `start_cluster`, removed by `close`."""

    net: Network
    folder: Path
    secrets: MeshSecrets
    lb_port: int = 0
    procs: dict[str, Proc] = field(default_factory=dict)

    def address(self, host: str) -> str:
        return self.net.hosts[host].address

    def grpc_of(self, service: str) -> str:
        """The gRPC address(es) of a service, comma-separated (as STARLING_*_ADDR wants)."""
        hosts = {"queue": QUEUES, "connection": NODES}.get(service, ("office",))
        return ",".join(f"{self.address(h)}:{GRPC_PORT[service]}" for h in hosts)

    def spawn(
        self, name: str, host: str, service: str, argv: list[str], env: dict[str, str]
    ) -> Proc:
        logs = self.folder / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{name}.log"
        wrapped = [sys.executable, "-m", "services.cli.deathsig", str(os.getpid()), *argv]
        prefix = self.net.exec_prefix(host) if host else []
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                [*prefix, *wrapped], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT
            )
        grpc = f"{self.address(host)}:{GRPC_PORT[service]}" if service in GRPC_PORT else ""
        proc = Proc(name, host, service, grpc, popen, log)
        self.procs[name] = proc
        return proc

    def events(self, name: str, event: str) -> int:
        """How many times component `name` logged `event` so far."""
        return self.procs[name].log.read_text(errors="replace").count(f'"event": "{event}"')

    def dead(self) -> list[str]:
        """Components whose process exited (none should, partitions only cut links)."""
        return [n for n, p in self.procs.items() if p.popen.poll() is not None]

    def close(self) -> None:
        """Stop every process (nodes first, infrastructure last), then remove the network."""
        order = sorted(self.procs.values(), key=lambda p: p.service in ("nats", "redis"))
        for p in order:
            if p.popen.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        for p in order:
            try:
                p.popen.wait(timeout=8)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()
        self.net.close()

    # ---- health ---------------------------------------------------------------------------

    def serving(self, name: str) -> bool:
        """The component answers: gRPC health SERVING, NATS /healthz 200, Redis PONG."""
        p = self.procs[name]
        if p.service == "nats":
            return _http_ok(f"http://{self.address(p.host)}:{MONITOR_PORT}/healthz")
        if p.service == "redis":
            return _redis_ping(self.address(p.host))
        if p.service == "haproxy":
            return p.popen.poll() is None
        return asyncio.run(check_health(p.grpc, timeout_s=1.0)) == "SERVING"

    def not_serving(self) -> list[str]:
        return [n for n in self.procs if not self.serving(n)]


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as r:
            return bool(r.status == 200)
    except (OSError, ValueError):
        return False


def _redis_ping(address: str) -> bool:
    import socket

    try:
        with socket.create_connection((address, REDIS_PORT), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


# ---- configuration of each kind of process ----------------------------------------------


def nats_config(c: Cluster, host: str) -> str:
    me = c.address(host)
    store = c.folder / host
    store.mkdir(parents=True, exist_ok=True)
    peers = [f"{c.address(h)}:{ROUTE_PORT}" for h in NATS_HOSTS if h != host]
    return (
        f'server_name: "{host}"\nlisten: "{me}:{NATS_PORT}"\nhttp: "{me}:{MONITOR_PORT}"\n'
        f'jetstream {{ store_dir: "{store}", sync_interval: always }}\n'
        + nats_cluster(c.secrets.nats_route_password, f"{me}:{ROUTE_PORT}", peers)
        + nats_limits()
        + nats_authorization(c.secrets)
    )


def redis_config(c: Cluster) -> str:
    folder = c.folder / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    return (
        f'port {REDIS_PORT}\nbind {c.address("redis")}\ndir {folder}\nsave ""\n'
        f"appendonly no\ndaemonize no\nrequirepass {c.secrets.redis_password}\n"
    )


def service_env(c: Cluster, host: str, service: str, extra: dict[str, str]) -> dict[str, str]:
    """A Starling process's environment: bound to its host's address, every peer's
    address, the mesh's secrets, the development profile, then `extra`."""
    user = NATS_USER_OF.get(service, "")
    env = {
        **os.environ,
        "STARLING_NODE_ID": host if service in ("connection", "queue") else service,
        "STARLING_GRPC_HOST": c.address(host),
        "STARLING_GRPC_PORT": str(GRPC_PORT[service]),
        "STARLING_METRICS_PORT": "0",
        "STARLING_NATS_URL": ",".join(f"nats://{c.address(h)}:{NATS_PORT}" for h in NATS_HOSTS),
        "STARLING_NATS_STREAM_REPLICAS": "3",
        "STARLING_REDIS_URL": f"redis://{c.address('redis')}:{REDIS_PORT}/0",
        "STARLING_DATA_DIR": str(c.folder / "data"),
        **{f"STARLING_{s.upper()}_ADDR": c.grpc_of(s) for s in ("session", "router", "queue")},
        "STARLING_QUOTA_ADDR": c.grpc_of("quota"),
        "STARLING_METRICS_ADDR": c.grpc_of("metrics"),
        "PYTHONUNBUFFERED": "1",
        "STARLING_NATS_USER": user,
        "STARLING_NATS_PASSWORD": c.secrets.nats[user] if user else "",
        "STARLING_REDIS_PASSWORD": c.secrets.redis_password,
        "STARLING_MESH_SECRET": c.secrets.mesh_secret,
        "STARLING_ADMIN_TOKEN": c.secrets.admin_token,
        "STARLING_ANONYMOUS_TENANTS": '["*"]',
        "STARLING_LOG_LEVEL": "INFO",
    }
    env.update(profile_settings(DEVELOPMENT, os.environ))
    if service == "queue":
        env["STARLING_INSTANCE_INDEX"] = env["STARLING_INSTANCE_ORDINAL"] = host[-1]
        env["STARLING_INSTANCE_COUNT"] = str(len(QUEUES))
    if service == "metrics":
        env["STARLING_CLUSTER_METRICS_PORT"] = str(9464)
    if service == "connection":
        env["STARLING_MQTT_HOST"] = c.address(host)
        env["STARLING_MQTT_PORT"] = str(MQTT_PORT)
        env["STARLING_WS_PORT"] = "-1"
        env["STARLING_PROXY_PROTOCOL"] = "true"
    env.update(extra)
    return env


def haproxy_config(c: Cluster) -> str:
    """TCP mode, round robin over the nodes, PROXY v2 to them (health checks too)."""
    servers = "\n".join(
        f"  server {n} {c.address(n)}:{MQTT_PORT} check send-proxy-v2 check-send-proxy"
        for n in NODES
    )
    return (
        "global\n  maxconn 4000\n"
        f"  stats socket {c.folder / 'haproxy.sock'} mode 600 level admin\n"
        "defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 120s\n"
        "  timeout server 120s\n  timeout check 1s\n"
        f"frontend mqtt\n  bind 127.0.0.1:{c.lb_port}\n  default_backend nodes\n"
        "backend nodes\n  balance roundrobin\n  default-server inter 500ms fall 2 rise 2\n"
        f"{servers}\n"
    )


def _wait(c: Cluster, names: list[str], timeout_s: float) -> None:
    """Until every one of `names` serves; RuntimeError naming the dead at once."""

    def serving() -> bool:
        dead = [n for n in names if c.procs[n].popen.poll() is not None]
        if dead:
            raise RuntimeError(f"{dead} exited during start-up; see {c.folder / 'logs'}")
        return all(c.serving(n) for n in names)

    wait_until(serving, timeout_s, f"{names} serving", every_s=0.1)


def start(c: Cluster, extra_env: dict[str, str], timeout_s: float = 90.0) -> None:
    """Every process of the mesh, each kind once the ones it needs serve: NATS and Redis,
    the back office, the queue instances, the nodes, HAProxy."""
    for host in NATS_HOSTS:
        c.spawn(
            host, host, "nats", [nats_binary(), "-c", str(_conf(c, host, nats_config(c, host)))], {}
        )
    c.spawn(
        "redis", "redis", "redis", [redis_binary(), str(_conf(c, "redis", redis_config(c)))], {}
    )
    _wait(c, [*NATS_HOSTS, "redis"], timeout_s)
    for service in OFFICE:
        c.spawn(
            service,
            "office",
            service,
            _python(service),
            service_env(c, "office", service, extra_env),
        )
    for host in QUEUES:
        c.spawn(host, host, "queue", _python("queue"), service_env(c, host, "queue", extra_env))
    _wait(c, [*OFFICE, *QUEUES], timeout_s)
    for host in NODES:
        env = service_env(c, host, "connection", extra_env)
        c.spawn(host, host, "connection", _python("connection"), env)
    _wait(c, list(NODES), timeout_s)
    c.lb_port = free_port()
    conf = _conf(c, "haproxy", haproxy_config(c))
    c.spawn(
        "haproxy", "", "haproxy", ["/usr/sbin/haproxy", "-db", "-f", str(conf)], dict(os.environ)
    )

    def listening() -> bool:
        if c.procs["haproxy"].popen.poll() is not None:
            raise RuntimeError(f"haproxy exited; see {c.procs['haproxy'].log}")
        return port_open("127.0.0.1", c.lb_port)

    wait_until(listening, timeout_s, f"haproxy listening; see {c.procs['haproxy'].log}")
    hosts = {h.name: h.address for h in c.net.hosts.values()}
    (c.folder / "hosts.json").write_text(json.dumps({"lb_port": c.lb_port, **hosts}, indent=2))


def _python(service: str) -> list[str]:
    return [sys.executable, "-m", f"services.{service}"]


def _conf(c: Cluster, name: str, text: str) -> Path:
    path = c.folder / f"{name}.conf"
    write_private(path, text)
    return path


@contextmanager
def cluster(folder: Path, extra_env: dict[str, str] | None = None) -> Iterator[Cluster]:
    """A network of `HOSTS` with the mesh on it; everything removed on exit, also after a
    failure (and a run killed before that is swept by the next: netns.sweep_leftovers)."""
    sweep_leftovers()
    net = Network()
    c = Cluster(net=net, folder=folder, secrets=MeshSecrets())
    try:
        for host in HOSTS:
            net.add(host)
        start(c, extra_env or {})
        yield c
    finally:
        c.close()
