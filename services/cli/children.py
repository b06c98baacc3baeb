"""The child processes of a local mesh: spawned so that they die with the launcher, stopped
in order (connection nodes, back-office services, Redis, NATS), killed, terminated and started
again with the same command, environment and ports. `Launcher` (services/cli/launcher.py)
builds on it; fault tests call `kill`, `terminate` and `restart` directly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from services.cli.forked import Forked, spawn
from services.cli.mesh import Component, Mesh

# A running child: spawned fresh, or forked by a fork server (services/cli/forkserver.py).
Process = subprocess.Popen[bytes] | Forked

# Children import `services` from here even when started from another working directory.
_ROOT = str(Path(__file__).resolve().parent.parent.parent)


class Children:
    """What every launcher holds: `procs` (one process per component name, the latest), the
    command and environment each was started with, and the mesh record their pids go to.
    The subclass sets these in its constructor. With `fork_server` (a socket path; test
    suites set `STARLING_FORK_SERVER`), service processes are forked by that server instead
    of started fresh: the same code, environment and working directory, without paying the
    imports again."""

    data_dir: Path
    mesh: Mesh
    procs: dict[str, Process]
    _specs: dict[str, tuple[list[str], dict[str, str] | None]]
    fork_server: str = ""

    def _spawn(self, comp: Component, argv: list[str], env: dict[str, str] | None = None) -> None:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        comp.log = str(logs / f"{comp.name}.log")
        proc = self._start(argv, env, Path(comp.log))
        comp.pid = proc.pid
        self.procs[comp.name] = proc
        self._specs[comp.name] = (argv, env)
        if comp not in self.mesh.components:
            self.mesh.components.append(comp)

    def _start(self, argv: list[str], env: dict[str, str] | None, log: Path) -> Process:
        if self.fork_server and argv[:2] == [sys.executable, "-m"] and len(argv) == 3:
            return spawn(
                server=self.fork_server,
                module=argv[2],
                env=dict(os.environ) if env is None else env,
                cwd=_ROOT,
                log=log,
            )
        out = open(log, "ab")
        wrapped = [sys.executable, "-m", "services.cli.deathsig", str(os.getpid()), *argv]
        proc = subprocess.Popen(
            wrapped,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=_ROOT,
        )
        out.close()
        return proc

    def stop(self, grace_s: float = 8.0) -> None:
        """Stop children in order; SIGKILL what outlives its grace period."""
        comps = self.mesh.components
        # The nodes (with every worker) and the gateway, a peer of theirs: their clients are
        # released while the session service still answers.
        nodes = [c for c in comps if c.name.startswith("connection-") or c.name == "gateway"]
        back_office = [c for c in comps if c.kind == "service" and c not in nodes]
        infra = [c for c in comps if c.kind in ("redis", "nats")]
        for group in (nodes, back_office, infra):
            for comp in group:
                proc = self.procs.get(comp.name)
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for comp in group:
                proc = self.procs.get(comp.name)
                if proc is None:
                    continue
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def restart(self, name: str, timeout_s: float = 30.0, wait: bool = True) -> Component:
        """Start `name` again with the same command, environment and ports (after a crash or
        a kill); returns once it serves (`wait`), or at once.

        Call it from a thread that outlives the child: PR_SET_PDEATHSIG fires when the thread
        that forked the child exits, not only the process."""
        from services.cli.status import component_status

        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        comp = self.mesh.by_name(name)
        argv, env = self._specs[name]
        self._spawn(comp, argv, env)
        self.mesh.save()
        if (
            wait
            and self.until(lambda: component_status(comp) == "SERVING", timeout_s, [name])
            is not None
        ):
            raise RuntimeError(f"{name} did not come back; see {comp.log}")
        return comp

    def until(
        self, cond: Callable[[], bool], timeout_s: float, watch: Iterable[str]
    ) -> list[str] | None:
        """Poll `cond` until it holds (None), a watched child exits (their names), or time
        runs out (an empty list)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if cond():
                return None
            dead = [n for n in watch if self.procs[n].poll() is not None]
            if dead:
                return dead
            time.sleep(0.05)
        return []

    def kill(self, name: str) -> None:
        """SIGKILL one component (fault tests)."""
        proc = self.procs[name]
        proc.kill()
        proc.wait()

    def terminate(self, name: str, grace_s: float = 10.0) -> None:
        """SIGTERM one component and wait for it to exit (a graceful stop, as an orchestrator
        does it); SIGKILL if it outlives `grace_s` (fault tests)."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def crashed(self) -> list[str]:
        return [name for name, p in self.procs.items() if p.poll() is not None]
