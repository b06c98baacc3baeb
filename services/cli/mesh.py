"""The record of a local mesh, `<data-dir>/mesh.json`: its components (names, pids, ports,
log files, restarts), the profile it runs with and the pid of the `starling up` that
supervises it. The launcher writes it; `starling status` and `starling restart` read it.

The file is replaced atomically (write, then rename), so a reader never sees half of it while
the supervisor records a restarted component's new pid.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

MESH_FILE = "mesh.json"


@dataclass
class Component:
    name: str
    kind: str  # "nats" | "redis" | "service"
    pid: int = 0  # 0: not a child of the launcher (serving, but started by hand)
    grpc_port: int = 0
    metrics_port: int = 0
    port: int = 0  # NATS / Redis / MQTT TCP port; the metrics service's cluster endpoint
    ws_port: int = 0
    tls_port: int = 0
    wss_port: int = 0
    log: str = ""
    service: str = ""  # the service an instance belongs to (back office; "" before issue 18)
    monitor_port: int = 0  # a clustered nats-server's HTTP monitor (/healthz: JetStream ready)
    restarts: int = 0  # times the supervisor (or `starling restart`) started it again
    url: str = ""  # a web endpoint's address (the console's pages, the gateway's HTTP API)
    coap_port: int = 0  # the gateway's CoAP (UDP) port

    def endpoint_port(self) -> int:
        """The port whose listener says this component runs: gRPC for a service (a node's
        workers share the MQTT ports), the client port for NATS and Redis."""
        return self.grpc_port if self.kind == "service" else self.port


@dataclass
class Mesh:
    data_dir: str
    components: list[Component] = field(default_factory=list)
    profile: str = ""  # "development" | "production"; "" in files older than issue 35
    launcher_pid: int = 0  # the `starling up` supervising it; 0: a test's launcher

    def by_name(self, name: str) -> Component:
        return next(c for c in self.components if c.name == name)

    def save(self) -> None:
        path = Path(self.data_dir) / MESH_FILE
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @staticmethod
    def load(data_dir: str) -> Mesh:
        raw = json.loads((Path(data_dir) / MESH_FILE).read_text())
        known = {f.name for f in fields(Component)}
        return Mesh(
            raw["data_dir"],
            [Component(**{k: v for k, v in c.items() if k in known}) for c in raw["components"]],
            profile=raw.get("profile", ""),
            launcher_pid=raw.get("launcher_pid", 0),
        )
