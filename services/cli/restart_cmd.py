"""`starling restart NAME [--data-dir D]`: ask the `starling up` running the mesh in D to
stop component NAME (SIGTERM, then SIGKILL after a grace period) and start it again on the
same ports, then wait until it serves. The request goes through D/control
(services/cli/control.py); only that launcher may start the process, so that it stays the
launcher's supervised child."""

from __future__ import annotations

import time
from pathlib import Path

from services.cli import control
from services.cli.mesh import Mesh
from services.cli.status import component_status, pid_alive


def run_restart(data_dir: Path, name: str, timeout_s: float = 60.0) -> int:
    try:
        mesh = Mesh.load(str(data_dir.resolve()))
    except FileNotFoundError:
        print(f"starling restart: no mesh in {data_dir} (start one with `starling up`)")
        return 1
    names = [c.name for c in mesh.components]
    if name not in names:
        print(f"starling restart: {data_dir} has no component {name!r} ({', '.join(names)})")
        return 2
    pid = mesh.launcher_pid
    if not pid or not pid_alive(pid):
        print(
            f"starling restart: no `starling up` runs the mesh in {data_dir}; "
            f"start it with `starling up --data-dir {data_dir}`"
        )
        return 1
    try:
        reply = control.ask(
            Path(mesh.data_dir), "restart", name, alive=lambda: pid_alive(pid), timeout_s=timeout_s
        )
    except (TimeoutError, ConnectionError) as exc:
        print(f"starling restart: {name}: {exc}")
        return 1
    if reply.error:
        print(f"starling restart: {name}: {reply.error}")
        return 1
    deadline = time.monotonic() + timeout_s
    status = "DOWN"
    while time.monotonic() < deadline:
        status = component_status(Mesh.load(mesh.data_dir).by_name(name))
        if status == "SERVING":
            print(f"{name} restarted (pid {reply.pid}): SERVING")
            return 0
        time.sleep(0.2)
    print(f"starling restart: {name} started (pid {reply.pid}) but is {status} after "
          f"{timeout_s:.0f} s; see {mesh.data_dir}/logs/{name}.log")  # fmt: skip
    return 1
