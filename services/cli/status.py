"""`starling status`: health of every component of a local mesh; exit 0 only if all serve.

Health is the endpoint's answer (gRPC health, a Redis PING, NATS's INFO), not the recorded
pid: a component started again by hand (`starling serve X` with the mesh's environment)
serves although the pid in mesh.json is gone; one whose pid lives but whose endpoint does not
answer is DOWN all the same.

gRPC is imported only to ask a service (services/cli/health.py), so the command stays cheap
where there is no mesh."""

from __future__ import annotations

import asyncio
import os
import socket
import urllib.request
from pathlib import Path

from services.cli.mesh import Component, Mesh
from services.cli.ports import port_open
from services.cli.profiles import describe


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of a launcher that has not reaped it is not alive
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _redis_ping(port: int) -> bool:
    """Redis answers (a password-protected one answers PING with NOAUTH: alive all the same)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


def _nats_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            return s.recv(4096).startswith(b"INFO")
    except OSError:
        return False


def _jetstream_ready(monitor_port: int) -> bool:
    """A clustered nats-server's /healthz: 200 once it serves and its JetStream has caught up
    with the cluster (a restarted server answers 503 until then)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{monitor_port}/healthz", timeout=1.0) as r:
            return bool(r.status == 200)
    except (OSError, ValueError):  # refused, timed out, or 503 (HTTPError is an OSError)
        return False


def component_status(c: Component) -> str:
    if c.pid and not pid_alive(c.pid) and not port_open("127.0.0.1", c.endpoint_port()):
        return "DOWN"  # gone, and nothing else took its port
    if c.kind == "redis":
        return "SERVING" if _redis_ping(c.port) else "DOWN"
    if c.kind == "nats":
        if not _nats_ping(c.port):
            return "DOWN"
        return "SERVING" if not c.monitor_port or _jetstream_ready(c.monitor_port) else "STARTING"
    from services.cli.health import status_of

    status = asyncio.run(status_of(f"127.0.0.1:{c.grpc_port}", "", timeout_s=1.0))
    return "DOWN" if status == "UNREACHABLE" else status


def run_status(data_dir: Path) -> int:
    try:
        mesh = Mesh.load(str(data_dir.resolve()))
    except FileNotFoundError:
        print(f"starling status: no mesh in {data_dir} (start one with `starling up`)")
        return 1
    ok = True
    for c in mesh.components:
        st = component_status(c)
        ok &= st == "SERVING"
        pid = str(c.pid) if c.pid and pid_alive(c.pid) else "-"
        print(f"{c.name:<16} {st:<11} pid {pid:>7}  restarts {c.restarts}")
    print(describe(mesh.profile))
    if mesh.launcher_pid and pid_alive(mesh.launcher_pid):
        print(f"supervised by starling up (pid {mesh.launcher_pid}): exits are restarted")
    else:
        print("no `starling up` supervises this mesh: nothing restarts a component that exits")
    return 0 if ok else 1
