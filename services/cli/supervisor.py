"""Supervision of a running local mesh: `starling up` calls `Supervisor.tick()` a few times a
second from its main thread.

Theory of operation:
- A child that exits while the mesh runs is started again with the same command,
  environment and ports (clients and peers find it where it was), after a back-off:
  `first_delay_s`, doubling with each further exit up to `max_delay_s`; a child that stayed
  up `reset_after_s` starts from `first_delay_s` again. Every exit and restart is logged
  (console and `<data-dir>/logs/launcher.log`) and counted in mesh.json, which also gets the
  new pid, so `starling status` follows it.
- Before a restart, if something already answers on the child's port (the operator ran
  `starling serve X` with the same environment), that process is adopted: nothing is
  spawned (it would fail to bind), mesh.json records pid 0 (status then asks the endpoint),
  and the child is started again only once that port goes quiet.
- `restart_now(name)` (`starling restart NAME`): SIGTERM, a grace period, SIGKILL, then a
  start without back-off.
- Stopping is the caller's: once it stops calling `tick()` nothing restarts, so the ordered
  stop of every child has no restart storm.
- Every start happens on the calling thread: PR_SET_PDEATHSIG fires when the thread that
  forked a child exits, so that thread must live as long as the mesh (the main thread).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from services.cli.children import Children
from services.cli.ports import port_open

log = logging.getLogger("starling.cli.up")


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    reset_after_s: float = 60.0
    term_grace_s: float = 10.0  # `starling restart`: SIGTERM, then SIGKILL after this


@dataclass(slots=True)
class _Watch:
    """What the supervisor knows of one component (owned by the Supervisor alone)."""

    started_at: float
    delay_s: float
    due_at: float = 0.0  # when a restart is scheduled; 0: none
    adopted: bool = False  # served by a process started by hand


class Supervisor:
    def __init__(
        self,
        *,
        children: Children,
        policy: RestartPolicy,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._children = children
        self._policy = policy
        self._clock = clock
        now = clock()
        self._watch = {
            name: _Watch(started_at=now, delay_s=policy.first_delay_s) for name in children.procs
        }

    def tick(self) -> None:
        """Notice exits, start what is due, reset the back-off of children that stayed up."""
        now = self._clock()
        for name, watch in self._watch.items():
            if watch.adopted:
                self._check_adopted(name, watch, now)
            elif self._children.procs[name].poll() is None:
                if now - watch.started_at >= self._policy.reset_after_s:
                    watch.delay_s = self._policy.first_delay_s
            elif not watch.due_at:
                self._schedule(name, watch, now)
            elif now >= watch.due_at:
                self._start_again(name, watch, now)

    def restart_now(self, name: str) -> int:
        """Stop `name` (gracefully, then by force) and start it again at once; its new pid.
        KeyError for a name the mesh does not have."""
        watch = self._watch[name]
        if self._children.procs[name].poll() is None:
            self._children.terminate(name, grace_s=self._policy.term_grace_s)
        watch.adopted = False
        self._spawn(name, watch, self._clock(), why="requested")
        return self._children.mesh.by_name(name).pid

    def _schedule(self, name: str, watch: _Watch, now: float) -> None:
        comp = self._children.mesh.by_name(name)
        code = self._children.procs[name].returncode
        watch.due_at = now + watch.delay_s
        log.warning(
            "component_exited %s code=%s restart_in_s=%.1f log=%s",
            name,
            code,
            watch.delay_s,
            comp.log,
        )
        watch.delay_s = min(watch.delay_s * 2, self._policy.max_delay_s)

    def _start_again(self, name: str, watch: _Watch, now: float) -> None:
        comp = self._children.mesh.by_name(name)
        if port_open("127.0.0.1", comp.endpoint_port()):
            # Someone serves it already (`starling serve` by hand): do not fight over the port.
            watch.adopted = True
            watch.due_at = 0.0
            comp.pid = 0
            self._children.mesh.save()
            log.warning("component_adopted %s port=%s", name, comp.endpoint_port())
            return
        self._spawn(name, watch, now, why="exited")

    def _check_adopted(self, name: str, watch: _Watch, now: float) -> None:
        """An adopted component whose port goes quiet is started again (first delay)."""
        comp = self._children.mesh.by_name(name)
        if watch.due_at:
            if now >= watch.due_at:
                watch.adopted = False
                self._spawn(name, watch, now, why="adopted process gone")
        elif not port_open("127.0.0.1", comp.endpoint_port(), timeout_s=0.2):
            watch.due_at = now + self._policy.first_delay_s
            log.warning("component_adopted_gone %s", name)

    def _spawn(self, name: str, watch: _Watch, now: float, why: str) -> None:
        comp = self._children.mesh.by_name(name)
        comp.restarts += 1
        self._children.restart(name, wait=False)  # saves mesh.json with the new pid
        watch.started_at = now
        watch.due_at = 0.0
        log.warning(
            "component_restarted %s pid=%s restarts=%s why=%s",
            name,
            comp.pid,
            comp.restarts,
            why,
        )
