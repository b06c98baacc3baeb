"""`starling up`: NATS, Redis and every service as child processes of one launcher.

Children run in their own session (so a terminal Ctrl-C reaches only the launcher, which
then stops them in order: connection nodes, back-office services, Redis, NATS) and die with
the launcher if it is killed (PR_SET_PDEATHSIG, armed by services.cli.deathsig, not by a
`preexec_fn`: see that module). Endpoints and pids are written to
`<data-dir>/mesh.json` (services/cli/mesh.py) for `starling status`. The children get the
settings of a profile (services/cli/profiles.py; `development` unless told). This class
starts, stops and restarts on request; `starling up` supervises it (services/cli/up.py,
services/cli/supervisor.py).

A node may run as several worker processes (`node_workers`, `starling up --node-workers N`):
each is a node of the mesh with its own node id (`node_worker_name`), and all of them listen
on the node's ports with SO_REUSEPORT, so the kernel spreads the node's connections over
them and one host's cores share the MQTT work. Sessions and takeover across workers are the
mesh's, as across nodes.

Every door is locked (services/cli/secrets.py generates the secrets): NATS has one user per
service, Redis a password (both in 0600 config files, never on a command line), internal gRPC
calls carry the mesh secret, and admin calls need the operator token, which `starling`'s
admin commands read from `<data-dir>/secrets/admin-token`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from services.cli.children import Children, Process
from services.cli.infra import nats_binary, nats_cluster_lines, nats_conf, redis_binary
from services.cli.mesh import Component, Mesh
from services.cli.ports import free_port
from services.cli.profiles import (
    DEVELOPMENT,
    anonymous_by_default,
    check_profile,
    profile_settings,
)
from services.cli.redis_setup import LocalRedis, check_redis_mode, start_local_redis
from services.cli.secrets import (
    NATS_USER_OF,
    MeshSecrets,
    admin_token_file,
    load_or_create,
    write_private,
)

__all__ = ["BACK_OFFICE", "Component", "Launcher", "Mesh", "nats_binary", "redis_binary"]

BACK_OFFICE = ("session", "router", "queue", "rules", "quota", "metrics")


def instance_name(service: str, index: int) -> str:
    """Component name and node id of one instance of a back-office service: the first keeps
    the service's own name (`router`), so a mesh of single instances is named as it always
    was; the others are `router-1`, `router-2`, ..."""
    return service if index == 0 else f"{service}-{index}"


def node_worker_name(node: int, worker: int) -> str:
    """Component name and node id of one worker of a node: worker 0 keeps the node's own
    name (`connection-0`), so a one-worker mesh is named as it always was; the others are
    `connection-0-w1`, `connection-0-w2`, ..."""
    return f"connection-{node}" if worker == 0 else f"connection-{node}-w{worker}"


class Launcher(Children):
    def __init__(
        self,
        *,
        data_dir: Path,
        nodes: int,
        mqtt_port: int,
        anonymous: bool | None = None,
        extra_env: dict[str, str] | None = None,
        ws: bool = True,
        tls: tuple[Path, Path] | None = None,
        node_workers: int = 1,
        instances: dict[str, int] | None = None,
        nats_servers: int = 1,
        profile: str = DEVELOPMENT,
        supervised: bool = False,
        redis: str = "standalone",
    ) -> None:
        """`instances`: how many of each back-office service (default one each); each gets
        `instance_index` and `instance_count` in its environment. `nats_servers`: above 1,
        a NATS cluster of that many servers (routes between them, JetStream on each).
        `profile`: the settings profile of the children (services/cli/profiles.py);
        `anonymous` (default: the profile's) lets anonymous clients into every tenant.
        `supervised`: a `starling up` that serves `starling restart` (mesh.json says so).
        `redis`: standalone, sentinel or cluster (services/cli/redis_setup.py)."""
        if nats_servers < 1:
            raise ValueError(f"nats_servers (--nats) must be at least 1, not {nats_servers}")
        if node_workers < 1:
            raise ValueError(
                f"node_workers (--node-workers) must be at least 1, not {node_workers}"
            )
        self.profile = check_profile(profile)
        self.redis_mode = check_redis_mode(redis)
        self.local_redis: LocalRedis | None = None  # started by start()
        self.data_dir = data_dir.resolve()
        self.nodes = nodes
        self.node_workers = node_workers
        self.nats_servers = nats_servers
        self.instances = _instances(instances or {})
        self.mqtt_port = mqtt_port
        self.anonymous = anonymous_by_default(profile) if anonymous is None else anonymous
        self.extra_env = extra_env or {}
        self.ws = ws
        self.tls = tls
        self.procs: dict[str, Process] = {}
        self.fork_server = os.environ.get("STARLING_FORK_SERVER", "")
        self._specs: dict[str, tuple[list[str], dict[str, str] | None]] = {}
        self.mesh = Mesh(
            str(self.data_dir), profile=self.profile, launcher_pid=os.getpid() if supervised else 0
        )
        self.secrets = MeshSecrets()  # replaced by the data dir's own in start()

    # ---- start ----------------------------------------------------------------------------

    def start_nats(self) -> list[Component]:
        """One nats-server, or a cluster of `nats_servers` (named nats, nats-1, nats-2, ...),
        every one with JetStream on its own store."""
        count = self.nats_servers
        comps = [
            Component(
                instance_name("nats", i),
                "nats",
                port=free_port(),
                monitor_port=free_port() if count > 1 else 0,
            )
            for i in range(count)
        ]
        cluster_ports = [free_port() for _ in comps] if count > 1 else []
        for i, comp in enumerate(comps):
            store = self.data_dir / comp.name
            store.mkdir(parents=True, exist_ok=True)
            cluster = ""
            if count > 1:
                cluster = nats_cluster_lines(
                    name=comp.name,
                    monitor_port=comp.monitor_port,
                    route_password=self.secrets.nats_route_password,
                    cluster_port=cluster_ports[i],
                    peers=[p for j, p in enumerate(cluster_ports) if j != i],
                )
            conf = self.data_dir / f"{comp.name}.conf"
            write_private(
                conf,
                nats_conf(port=comp.port, store=store, secrets=self.secrets, cluster=cluster),
            )
            self._spawn(comp, [nats_binary(), "-c", str(conf)])
        return comps

    def stream_replicas(self) -> int:
        """Replicas of the JetStream streams: three on a cluster of three or more (one server
        may die without a stream losing its quorum), else one."""
        return 3 if self.nats_servers >= 3 else 1

    def start_redis(self) -> Component:
        """The local Redis of `redis_mode`; returns its (first) primary."""
        self.local_redis = start_local_redis(
            mode=self.redis_mode,
            spawn=self._spawn,
            data_dir=self.data_dir,
            password=self.secrets.redis_password,
        )
        return self.local_redis.components[0]

    def _service_env(
        self, comp: Component, service: str, nats: list[Component], redis: Component
    ) -> dict[str, str]:
        nats_user = NATS_USER_OF.get(service, "")
        env = {
            **os.environ,
            "STARLING_NODE_ID": comp.name,
            "STARLING_GRPC_PORT": str(comp.grpc_port),
            "STARLING_METRICS_PORT": str(comp.metrics_port),
            "STARLING_NATS_URL": ",".join(f"nats://127.0.0.1:{n.port}" for n in nats),
            "STARLING_NATS_STREAM_REPLICAS": str(self.stream_replicas()),
            "STARLING_REDIS_URL": f"redis://127.0.0.1:{redis.port}/0",
            "STARLING_DATA_DIR": str(self.data_dir / "data"),
            "STARLING_SESSION_ADDR": self._addr("session"),
            "STARLING_ROUTER_ADDR": self._addr("router"),
            "STARLING_QUEUE_ADDR": self._addr("queue"),
            "STARLING_QUOTA_ADDR": self._addr("quota"),
            "STARLING_METRICS_ADDR": self._addr("metrics"),
            "STARLING_RULES_ADDR": self._addr("rules"),
            "PYTHONUNBUFFERED": "1",
            # Generated secrets win over the caller's environment; extra_env wins over them.
            "STARLING_NATS_USER": nats_user,
            "STARLING_NATS_PASSWORD": self.secrets.nats[nats_user] if nats_user else "",
            "STARLING_REDIS_PASSWORD": self.secrets.redis_password,
            "STARLING_MESH_SECRET": self.secrets.mesh_secret,
            "STARLING_ADMIN_TOKEN": self.secrets.admin_token,
        }
        env.update(self.local_redis.env if self.local_redis else {})
        env.update(profile_settings(self.profile, os.environ))
        if self.anonymous:
            env.setdefault("STARLING_ANONYMOUS_TENANTS", '["*"]')
        # Sampled spans of the local mesh go to one JSON-lines file per process (nothing is
        # sampled unless STARLING_TRACE_SAMPLE_RATIO or _TENANTS says so).
        env.setdefault("STARLING_TRACE_FILE_DIR", str(self.data_dir / "traces"))
        env.update(self.extra_env)
        return env

    def _addr(self, service: str) -> str:
        """The service's gRPC address: every instance's, comma-separated when several
        (services/common/rpc/client.py balances and fails over among them)."""
        return ",".join(
            f"127.0.0.1:{self._planned[instance_name(service, i)]}"
            for i in range(self.instances[service])
        )

    def plan(self) -> None:
        self._planned = {
            instance_name(name, i): free_port()
            for name in BACK_OFFICE
            for i in range(self.instances[name])
        }

    def start_service(
        self,
        name: str,
        service: str,
        nats: list[Component],
        redis: Component,
        mqtt_port: int = 0,
        ports_of: Component | None = None,
        elsewhere: str = "",
        index: int = 0,
    ) -> Component:
        """Start one service process. A connection node listens on `mqtt_port` and on WS /
        TLS / WSS ports of its own, or, given `ports_of` (another worker of the same node),
        on that one's ports; `elsewhere` is where its clients go when it drains (the other
        nodes' MQTT addresses)."""
        comp = Component(
            name,
            "service",
            grpc_port=self._planned.get(name) or free_port(),
            metrics_port=free_port(),
            service=service,
        )
        env = self._service_env(comp, service, nats, redis)
        if service in self.instances:
            count = str(self.instances[service])
            env["STARLING_INSTANCE_INDEX"] = env["STARLING_INSTANCE_ORDINAL"] = str(index)
            env["STARLING_INSTANCE_COUNT"] = count
        if service == "metrics":
            comp.port = free_port()  # the cluster's Prometheus endpoint
            env["STARLING_CLUSTER_METRICS_PORT"] = str(comp.port)
        if service == "console":  # the web console's HTTP port
            comp.port = free_port()
            env["STARLING_CONSOLE_PORT"] = str(comp.port)
            comp.url = f"http://127.0.0.1:{comp.port}/"
            # Where the console finds every instance to watch and every node to drain.
            env["STARLING_CONSOLE_MESH_FILE"] = str(self.data_dir / "mesh.json")
        if service == "gateway":
            self._gateway_env(comp, env)
        if service == "connection":
            self._node_env(comp, env, mqtt_port, ports_of, elsewhere)
        self._spawn(comp, [sys.executable, "-m", f"services.{service}"], env)
        return comp

    def _gateway_env(self, comp: Component, env: dict[str, str]) -> None:
        """The gateway's HTTP (`port`), HTTPS (`tls_port`, with the nodes' certificate) and
        CoAP (`coap_port`, UDP) ports into `comp` and `env`."""
        comp.port, comp.coap_port = free_port(), free_port()
        comp.url = f"http://127.0.0.1:{comp.port}/api/v5/publish"
        env["STARLING_GATEWAY_HTTP_PORT"] = str(comp.port)
        env["STARLING_GATEWAY_COAP_PORT"] = str(comp.coap_port)
        if self.tls is not None:
            comp.tls_port = free_port()
            env["STARLING_GATEWAY_HTTPS_PORT"] = str(comp.tls_port)
            env["STARLING_TLS_CERT_FILE"] = str(self.tls[0])
            env["STARLING_TLS_KEY_FILE"] = str(self.tls[1])

    def _node_env(
        self,
        comp: Component,
        env: dict[str, str],
        mqtt_port: int,
        ports_of: Component | None,
        elsewhere: str,
    ) -> None:
        """A connection node's ports (its own, or `ports_of`'s) into `comp` and `env`."""
        comp.port = mqtt_port
        env["STARLING_MQTT_PORT"] = str(mqtt_port)
        env["STARLING_MQTT_HOST"] = env.get("STARLING_MQTT_HOST", "127.0.0.1")
        if "STARLING_DRAIN_SERVER_REFERENCE" not in self.extra_env:
            env["STARLING_DRAIN_SERVER_REFERENCE"] = elsewhere
        if self.node_workers > 1:
            # Every worker of a node binds the same ports; without it the second fails.
            env["STARLING_REUSE_PORT"] = "true"
        if self.ws:
            comp.ws_port = ports_of.ws_port if ports_of else free_port()
            env["STARLING_WS_PORT"] = str(comp.ws_port)
        if self.tls is not None:
            if ports_of is not None:
                comp.tls_port, comp.wss_port = ports_of.tls_port, ports_of.wss_port
            else:
                comp.tls_port, comp.wss_port = free_port(), free_port()
            env["STARLING_TLS_PORT"] = str(comp.tls_port)
            env["STARLING_WSS_PORT"] = str(comp.wss_port)
            env["STARLING_TLS_CERT_FILE"] = str(self.tls[0])
            env["STARLING_TLS_KEY_FILE"] = str(self.tls[1])

    def _start_nodes(self, nats: list[Component], redis: Component) -> None:
        # Port 0: each node's port is picked here, once, so that every worker binds the same
        # one and every node knows the others' (the Server Reference of a drain).
        ports = [self.mqtt_port + i if self.mqtt_port else free_port() for i in range(self.nodes)]
        for i in range(self.nodes):
            others = " ".join(f"127.0.0.1:{p}" for j, p in enumerate(ports) if j != i)
            first = self.start_service(
                node_worker_name(i, 0),
                "connection",
                nats,
                redis,
                mqtt_port=ports[i],
                elsewhere=others,
            )
            for w in range(1, self.node_workers):
                self.start_service(
                    node_worker_name(i, w),
                    "connection",
                    nats,
                    redis,
                    mqtt_port=first.port,
                    ports_of=first,
                    elsewhere=others,
                )

    @property
    def admin_token(self) -> str:
        """The operator token the services run with."""
        return self.extra_env.get("STARLING_ADMIN_TOKEN", self.secrets.admin_token)

    def start(self, timeout_s: float = 60.0) -> Mesh:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.secrets = load_or_create(self.data_dir)
        write_private(admin_token_file(self.data_dir), self.admin_token + "\n")
        self.plan()
        nats = self.start_nats()
        redis = self.start_redis()
        from services.cli.status import component_status

        for n in nats:  # a cluster's servers: JetStream ready (services create streams)
            _wait(partial(_serving, n), timeout_s, n.name, self)
        ready = self.local_redis.ready if self.local_redis else lambda: False
        _wait(ready, timeout_s, "redis", self)

        for name in BACK_OFFICE:
            for i in range(self.instances[name]):
                self.start_service(instance_name(name, i), name, nats, redis, index=i)
        # Nodes announce themselves (hello) as they start: the session service must be
        # listening by then, so the back office serves first.
        for comp in list(self.mesh.components):
            if comp.service in BACK_OFFICE:
                _wait(lambda c=comp: component_status(c) == "SERVING", timeout_s, comp.name, self)
        self._start_nodes(nats, redis)
        self.start_service("console", "console", nats, redis)  # over the admin APIs
        self.start_service("gateway", "gateway", nats, redis)  # HTTP and CoAP, a node's peer
        self.mesh.save()
        for comp in self.mesh.components:
            _wait(lambda c=comp: component_status(c) == "SERVING", timeout_s, comp.name, self)
        return self.mesh


def _serving(comp: Component) -> bool:
    from services.cli.status import component_status

    return component_status(comp) == "SERVING"


def _wait(cond: Callable[[], bool], timeout_s: float, what: str, launcher: Launcher) -> None:
    """Start-up: wait for `cond`; on any child's exit or a timeout stop the mesh and exit."""
    dead = launcher.until(cond, timeout_s, list(launcher.procs))
    if dead is None:
        return
    launcher.stop()
    if dead:
        logs = ", ".join(launcher.mesh.by_name(d).log for d in dead)
        raise SystemExit(f"starling up: {', '.join(dead)} exited during start-up; see {logs}")
    raise SystemExit(f"starling up: {what} did not become ready in {timeout_s:.0f}s")


def _instances(asked: dict[str, int]) -> dict[str, int]:
    """Instances of every back-office service: one each unless `asked`."""
    counts = {name: 1 for name in BACK_OFFICE}
    for name, count in asked.items():
        if name not in counts or count < 1:
            raise ValueError(f"instances: {name}={count} (a back-office service, >= 1)")
        counts[name] = count
    return counts
