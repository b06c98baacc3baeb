"""The seeded scheduler: runs several processes (coroutines) on one event loop and decides,
from its seed alone, which pending store call happens next. Every call a process makes waits
in `pending` until picked, so calls are delayed and reordered; a process can be paused for a
number of steps (its calls wait) and then resumes; hints land and the clock moves at steps
the seed picks. Invariant checks run after every step. Same seed, same run: nothing reads the
wall clock or another source of randomness, and the loop is drained after every step, so
asyncio's own order is the same each time.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

_PROC: contextvars.ContextVar[str] = contextvars.ContextVar("sim_proc", default="setup")


class StuckError(Exception):
    """Processes wait on each other with no store call pending (a deadlock in the harness)."""


@dataclass
class Scheduler:
    rng: random.Random
    pause_p: float = 0.03
    skew_us: int = 50_000
    step: int = 0
    pending: list[tuple[str, Callable[[], None], str]] = field(default_factory=list)
    tracing: bool = False  # keep `trace`: every call as it runs (for replaying a seed)
    # Free-running: every call runs as soon as the loop gets to it, no `run` needed (the
    # store contract tests use the model as a Cassandra stand-in this way).
    free: bool = False
    paused: dict[str, int] = field(default_factory=dict)  # process -> step it resumes at
    trace: list[str] = field(default_factory=list)
    checks: list[Callable[[], None]] = field(default_factory=list)
    on_step: list[Callable[[], None]] = field(default_factory=list)  # hints, clock
    _skews: dict[str, int] = field(default_factory=dict)

    def current(self) -> str:
        return _PROC.get()

    def skew(self, proc: str) -> int:
        if proc not in self._skews:
            self._skews[proc] = self.rng.randint(-self.skew_us, self.skew_us)
        return self._skews[proc]

    def submit(self, proc: str, run: Callable[[], None], label: str = "") -> None:
        if self.free:
            asyncio.get_running_loop().call_soon(run)
        else:
            self.pending.append((proc, run, label))

    async def sleep(self, steps: int = 1) -> None:
        """Let `steps` picks of this process go by (a timer is a call like any other)."""
        for _ in range(steps):
            fut = asyncio.get_running_loop().create_future()
            self.submit(self.current(), lambda f=fut: f.done() or f.set_result(None), "sleep")
            await fut

    async def run(self, procs: dict[str, Coroutine[Any, Any, Any]], max_steps: int) -> None:
        """Run `procs` to the end (or `max_steps`), one pending call per step."""
        tasks = []
        for name, coro in procs.items():
            ctx = contextvars.copy_context()
            ctx.run(_PROC.set, name)
            tasks.append(asyncio.get_running_loop().create_task(coro, context=ctx))
        try:
            await self._settle()
            while not all(t.done() for t in tasks) and self.step < max_steps:
                self.step += 1
                self._one_step()
                await self._settle()
                for check in self.checks:
                    check()
            for t in tasks:
                if t.done() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            for t in tasks:
                t.cancel()
            await self._settle()

    def _one_step(self) -> None:
        for hook in self.on_step:
            hook()
        if self.pending and self.rng.random() < self.pause_p:
            proc = self.rng.choice(sorted({p for p, _, _ in self.pending}))
            self.paused[proc] = self.step + self.rng.randint(5, 60)
            if self.tracing:
                self.trace.append(f"{self.step} pause {proc} until {self.paused[proc]}")
        ready = [
            i for i, (p, _, _) in enumerate(self.pending) if self.paused.get(p, 0) <= self.step
        ]
        if not ready:
            if not self.pending:
                raise StuckError(f"step {self.step}: nothing pending")
            first = min(self.paused[p] for p, _, _ in self.pending)
            self.paused = {p: s for p, s in self.paused.items() if s > first}
            ready = [i for i, (p, _, _) in enumerate(self.pending) if p not in self.paused]
        proc, run, label = self.pending.pop(self.rng.choice(ready))
        if self.tracing:
            self.trace.append(f"{self.step} {proc}: {label}")
        try:
            run()
        except Exception as exc:
            if self.tracing:
                self.trace.append(f"{self.step} {proc}: -> {type(exc).__name__}")
            raise

    async def _settle(self) -> None:
        """Run the loop until nothing is ready: every process is waiting on a call."""
        loop = asyncio.get_running_loop()
        for _ in range(10_000):
            await asyncio.sleep(0)
            if not getattr(loop, "_ready", ()):
                return
