"""The queue hand-over world: an old owner, a new owner that claims the partition mid-stream,
a reader that reads, delivers and acks, and a compactor, all on the REAL queue store (any
module with `CassandraQueueStore`), over the simulated cluster, under one seed.

Invariants, checked after every step (a `ViolationError` names the first one broken):
- no loss: a message whose append was answered OK (or DUPLICATE: stored before) and is not
  expired is delivered, or is still in the queue above acked_through (as the cluster will
  converge: every replica, hint and accepted proposal);
- order: the reader never gets a message it has not had before at a seq below one it had;
  each publisher's messages are delivered in the order their appends were answered;
- one writer: once the new owner's claim returned, no queue entry written under an older
  epoch takes effect (reaches a replica or commits);
- compaction removes only entries at or below acked_through, or expired ones.
At the end the faults stop, every hint lands and a last reader drains the queue.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from cassandra import ConsistencyLevel

from services.common.store import cassandra_queue_compaction as compaction
from services.common.store.ports_queue import AppendOutcome, NewQueueItem
from tests.simulation.cluster import NO_FAULTS, Cluster, Faults
from tests.simulation.data import Mutation
from tests.simulation.scheduler import Scheduler
from tests.simulation.session import SimBatch, SimSession

T, Q, P, KS = "t", "q#1", 7, "sim"


class ViolationError(AssertionError):
    """An invariant broken; the message names the seed and what happened."""


@dataclass
class World:
    seed: int
    module: ModuleType
    layout: str  # "log" (queue_log) or "legacy" (queue_entries / queue_state)
    rng: random.Random
    cluster: Cluster
    sched: Scheduler
    session: SimSession
    promised: dict[str, tuple[str, int]] = field(default_factory=dict)  # mid -> publisher, n
    expired: set[str] = field(default_factory=set)
    delivered: dict[str, int] = field(default_factory=dict)  # mid -> seq first delivered
    top_seq: int = 0
    claimed: int = 0  # the new owner's epoch once its claim returned
    writers_done: int = 0
    errors: list[str] = field(default_factory=list)
    violation: ViolationError | None = None
    _checked: tuple[int, ...] = ()
    one_writer: bool = True  # check it (off: to see what a stale writer leads to)
    strict: bool = True  # an exception other than a driver timeout fails the run

    def errors_to_retry(self) -> tuple[type[Exception], ...]:
        return _DRIVER_ERRORS if self.strict else (Exception,)

    def store(self) -> Any:
        return self.module.CassandraQueueStore.on_session(
            self.session, ConsistencyLevel.SERIAL, SimBatch
        )

    def fail(self, what: str) -> None:
        # Kept as well as raised: raised inside a store call, the store would see an error.
        self.violation = self.violation or ViolationError(
            f"seed {self.seed} step {self.sched.step}: {what}"
        )
        raise self.violation

    def check_violation(self) -> None:
        if self.violation is not None:
            raise self.violation

    # ---- what the cluster converges to ----
    def truth(self) -> tuple[int, dict[str, tuple[int, int]]]:
        """acked_through, and mid -> (seq, expires_at_ms) of every stored entry."""
        now = self.cluster.now_us
        if self.layout == "log":
            part = self.cluster.truth("queue_log", (T, Q))
            acked = part.live_static(now).get("acked_through") or 0
            rows = part.live_rows(now)
            return acked, {
                r["message_id"]: (ck[0], r.get("expires_at_ms") or 0)
                for ck, r in rows
                if ck[0] >= 1 and "message_id" in r
            }
        state = self.cluster.truth("queue_state", (T, Q)).live_row((), now) or {}
        rows = self.cluster.truth("queue_entries", (T, Q, 0)).live_rows(now)
        entries = {
            r["message_id"]: (ck[0], r.get("expires_at_ms") or 0)
            for ck, r in rows
            if "message_id" in r
        }
        return state.get("acked_through") or 0, entries

    # ---- checks ----
    def check_no_loss(self) -> None:
        seen = (self.cluster.changes, len(self.promised), len(self.delivered), self.cluster.now_us)
        if seen == self._checked:
            return  # nothing it looks at moved since the last check
        self._checked = seen
        acked, entries = self.truth()
        for mid, (pub, n) in self.promised.items():
            if mid in self.delivered or mid in self.expired:
                continue
            got = entries.get(mid)
            if got is None:
                self.fail(f"{mid} ({pub} #{n}) was answered OK and is gone undelivered")
            if got[0] <= acked:
                at = f"seq {got[0]} <= acked_through {acked}"
                self.fail(f"{mid} ({pub} #{n}) sits at {at}: never delivered")

    def on_effect(self, m: Mutation) -> None:
        """One writer and compaction checks, when a write takes effect."""
        acked, entries = self.truth()
        by_seq = {seq: (mid, exp) for mid, (seq, exp) in entries.items()}
        for op in m.ops:
            if op[0] == "cells" and op[3] is not None and "data" in op[4]:
                epoch = int(op[4]["data"].split(b":")[0])
                if self.one_writer and self.claimed and epoch < self.claimed:
                    what = f"seq {op[3][0]} of epoch {epoch}"
                    self.fail(f"{m.tag} wrote {what} after epoch {self.claimed} was claimed")
            if m.tag == "compactor" and op[0] in ("rowdel", "rangedel"):
                lo, hi = (op[3][0], op[3][0]) if op[0] == "rowdel" else (op[3], op[4])
                for seq in range(max(lo, acked + 1), min(hi, max(by_seq, default=0)) + 1):
                    if seq in by_seq and not self._expired(by_seq[seq][1]):
                        what = f"seq {seq} ({by_seq[seq][0]})"
                        self.fail(f"compaction deleted {what} above acked_through {acked}")

    def _expired(self, expires_at_ms: int) -> bool:
        return bool(expires_at_ms) and expires_at_ms * 1000 <= self.cluster.now_us

    def deliver(self, seq: int, data: bytes) -> None:
        mid = data.split(b":", 1)[1].decode()
        if mid in self.delivered:
            return
        if seq < self.top_seq:
            self.fail(f"{mid} delivered at seq {seq} after seq {self.top_seq}")
        self.delivered[mid] = seq
        self.top_seq = seq


async def _retry(w: World, call: Any) -> Any:
    while True:
        try:
            return await call()
        except Exception as exc:  # a timeout: the caller tries again
            w.errors.append(type(exc).__name__)
            if not isinstance(exc, w.errors_to_retry()):
                raise


def _driver_errors() -> tuple[type[Exception], ...]:
    from cassandra import ReadTimeout, WriteTimeout

    return (ReadTimeout, WriteTimeout)


_DRIVER_ERRORS = _driver_errors()


async def owner(w: World, name: str, count: int, delay: int) -> None:
    """Claims the partition (after `delay` steps) and appends `count` messages, one call each;
    a call that failed is retried with the same message id (the publisher's retry)."""
    store = w.store()
    await w.sched.sleep(delay)
    epoch = await _retry(w, lambda: store.claim_partition(P))
    if name == "new":
        w.claimed = epoch
    for n in range(count):
        mid = f"{name}-{n}"
        expires = 1 if w.rng.random() < 0.15 else 0  # long expired: never to be delivered
        item = NewQueueItem(mid, 1, f"{epoch}:{mid}".encode(), expires)
        if expires:
            w.expired.add(mid)
        rep = await _retry(w, lambda item=item: store.append(T, Q, [item], P, epoch, 0, True))
        outcome = rep.outcomes[0]
        if outcome in (AppendOutcome.OK, AppendOutcome.DUPLICATE):
            w.promised[mid] = (name, n)
        elif outcome == AppendOutcome.FENCED:
            break
    w.writers_done += 1


async def reader(w: World, writers: int, final: bool = False) -> None:
    """Reads from where it got to, delivers, acks what it got; ends after two empty reads
    once the writers are done."""
    store = w.store()
    nxt, idle = 1, 0
    while idle < 2:
        limit = w.rng.randint(1, 4)
        try:
            entries, _ = await store.read(T, Q, nxt, limit, mark_delivered=True)
        except w.errors_to_retry() as exc:
            w.errors.append(type(exc).__name__)
            await w.sched.sleep(1)
            continue
        if not entries:
            idle += w.writers_done >= writers
            if not final:
                await w.sched.sleep(1)
            continue
        for e in entries:
            w.deliver(e.seq, e.data)
        nxt = entries[-1].seq + 1
        try:
            await store.ack(T, Q, entries[-1].seq)
        except w.errors_to_retry() as exc:
            w.errors.append(type(exc).__name__)


async def run_plan(w: World, plan: Any) -> Any:
    """A compaction plan on the simulated session (scheduled like every other call)."""
    from services.common.store.cassandra import _future
    from tests.simulation.session import SimPrepared

    rows: Any = None
    try:
        step = next(plan)
        while True:
            query, values, serial = step
            stmt = SimPrepared(query, ConsistencyLevel.SERIAL if serial else None)
            try:
                rows = await _future(w.session.execute_async(stmt, values))
            except _DRIVER_ERRORS:
                rows = None
            step = plan.send(rows)
    except StopIteration as done:
        return done.value


async def compactor(w: World, writers: int) -> None:
    """Proposes deletes the way a job scanning a stale snapshot would: acked ranges past the
    real acked_through, 'expired' seqs that are not; the conditions must refuse those."""
    while w.writers_done < writers:
        await w.sched.sleep(w.rng.randint(3, 12))
        top = max(w.delivered.values(), default=0) + 2
        await run_plan(w, compaction.acked_plan(KS, T, Q, 1, w.rng.randint(0, top)))
        seqs = sorted(w.rng.sample(range(1, top + 3), 2))
        now_ms = w.cluster.now_us // 1000
        await run_plan(w, compaction.expired_plan(KS, T, Q, seqs, now_ms))


def build(seed: int, module: ModuleType, layout: str, faults: Faults, cl: int) -> World:
    rng = random.Random(seed)
    cluster = Cluster(random.Random(rng.getrandbits(64)), faults)
    sched = Scheduler(random.Random(rng.getrandbits(64)), faults.pause, faults.clock_skew_us)
    session = SimSession(cluster, sched, cl)
    session.create(module.MIGRATIONS)
    w = World(seed, module, layout, random.Random(rng.getrandbits(64)), cluster, sched, session)
    cluster.on_effect.append(w.on_effect)
    sched.checks += [w.check_violation, w.check_no_loss]

    def tick() -> None:
        cluster.now_us += w.rng.randint(0, 2000)
        if w.rng.random() < 0.3:
            cluster.deliver_hint()

    sched.on_step.append(tick)
    return w


def run_seed(
    seed: int,
    module: ModuleType,
    layout: str = "log",
    faults: Faults | None = None,
    cl: int = ConsistencyLevel.LOCAL_QUORUM,
    compact: bool = True,
    max_steps: int = 4000,
    one_writer: bool = True,
) -> World:
    """One interleaving; raises `ViolationError` when an invariant breaks."""
    w = build(seed, module, layout, faults or Faults(), cl)
    w.one_writer = one_writer
    w.strict = layout == "log"
    procs = {
        "old": owner(w, "old", w.rng.randint(2, 6), 0),
        "new": owner(w, "new", w.rng.randint(2, 5), w.rng.randint(1, 25)),
        "reader": reader(w, 2),
    }
    if compact:
        procs["compactor"] = compactor(w, 2)
    asyncio.run(_main(w, procs, max_steps))
    return w


async def _main(w: World, procs: dict[str, Any], max_steps: int) -> None:
    await w.sched.run(procs, max_steps)
    w.cluster.faults = NO_FAULTS
    w.sched.pause_p = 0
    w.cluster.deliver_all()
    w.check_no_loss()
    await w.sched.run({"drain": reader(w, 0, final=True)}, max_steps)
    w.check_no_loss()
    missing = sorted(m for m in w.promised if m not in w.delivered and m not in w.expired)
    if missing:
        w.fail(f"answered OK, never delivered: {missing}")
