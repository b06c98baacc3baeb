"""`starling up`: start a local mesh (services/cli/launcher.py), print its endpoints, and
look after it until Ctrl-C or SIGTERM: children that exit are restarted
(services/cli/supervisor.py) and `starling restart NAME` requests are served
(services/cli/control.py). Exits and restarts go to the console and to
`<data-dir>/logs/launcher.log`.

A signal only raises a flag; the loop then stops supervising before it stops the children,
so the ordered stop causes no restarts.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.cli import control
from services.cli.launcher import Launcher, Mesh
from services.cli.profiles import DEVELOPMENT, describe
from services.cli.secrets import admin_token_file
from services.cli.supervisor import RestartPolicy, Supervisor

log = logging.getLogger("starling.cli.up")

TICK_S = 0.2


@dataclass(frozen=True, slots=True)
class UpOptions:
    """`starling up`'s options (services/cli/main.py builds them from the command line)."""

    data_dir: Path
    nodes: int = 1
    mqtt_port: int = 1883
    node_workers: int = 1
    instances: dict[str, int] = field(default_factory=dict)
    nats_servers: int = 1
    profile: str = DEVELOPMENT
    redis: str = "standalone"  # standalone | sentinel | cluster (services/cli/redis_setup.py)
    policy: RestartPolicy = field(default_factory=RestartPolicy)


def _log_to(data_dir: Path) -> None:
    """Supervision events: one line each on stderr and in logs/launcher.log."""
    (data_dir / "logs").mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(data_dir / "logs" / "launcher.log")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    to_console = logging.StreamHandler(sys.stderr)
    to_console.setFormatter(logging.Formatter("starling up: %(message)s"))
    log.handlers[:] = [to_file, to_console]
    log.setLevel(logging.INFO)
    log.propagate = False


def print_endpoints(mesh: Mesh) -> None:
    print(f"Starling mesh is up (data dir {mesh.data_dir})")
    print(f"{'component':<16} {'pid':>7} {'endpoint':<28} {'metrics':<24}")
    for c in mesh.components:
        if c.kind == "nats":
            ep = f"nats://127.0.0.1:{c.port}"
        elif c.kind == "redis":
            ep = f"redis://127.0.0.1:{c.port}"
        else:
            ep = f"grpc 127.0.0.1:{c.grpc_port}"
        metrics = f"http://127.0.0.1:{c.metrics_port}/metrics" if c.metrics_port else ""
        print(f"{c.name:<16} {c.pid:>7} {ep:<28} {metrics:<24}")
        if c.name.startswith("connection-"):
            print(f"{'':<16} {'':>7} mqtt://127.0.0.1:{c.port}")
            if c.ws_port:
                print(f"{'':<16} {'':>7} ws://127.0.0.1:{c.ws_port}/mqtt")
        elif c.service == "console" and c.port:
            print(f"{'':<16} {'':>7} {'web console':<28} {c.url}")
        elif c.service == "gateway":
            if c.port:
                print(f"{'':<16} {'':>7} http://127.0.0.1:{c.port}/api/v5/publish")
            if c.tls_port:
                print(f"{'':<16} {'':>7} https://127.0.0.1:{c.tls_port}/api/v5/publish")
            if c.coap_port:
                print(f"{'':<16} {'':>7} coap://127.0.0.1:{c.coap_port}/ps/{{topic}}")
        elif (c.service or c.name) == "metrics" and c.port:
            print(f"{'':<16} {'':>7} {'cluster metrics':<28} http://127.0.0.1:{c.port}/metrics")
    print(describe(mesh.profile))
    print(
        "Admin commands read the operator token from "
        f"{admin_token_file(Path(mesh.data_dir))} (or STARLING_ADMIN_TOKEN).",
    )
    print(
        "A component that exits is started again (logs/launcher.log); "
        "`starling restart NAME` restarts one. Ctrl-C stops everything.",
        flush=True,
    )


def serve_requests(data_dir: Path, supervisor: Supervisor) -> None:
    """Answer the `starling restart` requests waiting in the control folder."""
    for req in control.pending(data_dir):
        if req.action != "restart":
            control.answer(data_dir, req, control.Answer(error=f"unknown action {req.action!r}"))
            continue
        try:
            pid = supervisor.restart_now(req.name)
        except KeyError:
            control.answer(data_dir, req, control.Answer(error=f"no component {req.name!r}"))
            continue
        control.answer(data_dir, req, control.Answer(pid=pid))


def run_up(opts: UpOptions) -> int:
    launcher = Launcher(
        data_dir=opts.data_dir,
        nodes=opts.nodes,
        mqtt_port=opts.mqtt_port,
        node_workers=opts.node_workers,
        instances=opts.instances,
        nats_servers=opts.nats_servers,
        profile=opts.profile,
        supervised=True,
        redis=opts.redis,
    )
    stopping: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    control.reset(launcher.data_dir)
    mesh = launcher.start()
    _log_to(launcher.data_dir)
    print_endpoints(mesh)
    supervisor = Supervisor(children=launcher, policy=opts.policy)
    try:
        while not stopping:
            supervisor.tick()
            serve_requests(launcher.data_dir, supervisor)
            time.sleep(TICK_S)
    finally:
        print("starling up: stopping", flush=True)
        launcher.stop()
    return 0
