"""A Cassandra cluster as its guarantees, and nothing more (DESIGN.md, third wave).

- Replicas (3): a plain write reaches each replica now, later (a hint delivered at a step the
  seed picks) or never; it succeeds when enough replicas for its consistency level took it
  now, else the client gets WriteTimeout (what reached a replica stays). Its timestamp is the
  writing process's clock, which the seed skews: last write wins by that timestamp.
- Reads at ONE/LOCAL_ONE ask one replica (possibly stale); QUORUM/LOCAL_QUORUM ask two and
  write the merged result back to them (blocking read repair), so quorum reads and writes
  overlap.
- Lightweight transactions: Paxos per partition, modelled as a serial order: each one first
  completes a proposal left accepted by an earlier one, then reads a quorum (every committed
  transaction is on a quorum), decides its conditions and commits at a ballot timestamp above
  every earlier one of the partition. A timeout (WriteTimeout, write type CAS) leaves it
  unknown to the client: not applied, applied, or accepted and completed by the next
  transaction or SERIAL read of the partition; the seed decides. SERIAL/LOCAL_SERIAL reads
  complete such a proposal and read a quorum.
- A conditional batch must stay inside one partition (InvalidRequest otherwise); a batch over
  several partitions over 50 KiB is refused (single-partition batches are exempt, as in
  Cassandra since 3.0).
- TTLs expire on the simulated clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cassandra import ConsistencyLevel, InvalidRequest, ReadTimeout, WriteTimeout, WriteType

from tests.simulation.data import Mutation, Part, Replica

SERIALS = (ConsistencyLevel.SERIAL, ConsistencyLevel.LOCAL_SERIAL)
BATCH_FAIL_BYTES = 50 * 1024


@dataclass(frozen=True, slots=True)
class Faults:
    """How often the seed makes each thing go wrong (0: never)."""

    replica_late: float = 0.25  # a replica gets a plain write later (a hint)
    replica_never: float = 0.05  # ... or never
    read_timeout: float = 0.02
    write_timeout: float = 0.02  # a plain write answered with WriteTimeout regardless
    cas_unknown: float = 0.05  # a lightweight transaction answered with WriteTimeout(CAS)
    pause: float = 0.03  # per step: a process paused for a while
    clock_skew_us: int = 50_000  # the range of each process's clock skew


NO_FAULTS = Faults(0, 0, 0, 0, 0, 0, 0)


def _required(cl: int, n: int) -> int:
    if cl in (ConsistencyLevel.ONE, ConsistencyLevel.LOCAL_ONE, ConsistencyLevel.ANY):
        return 1
    if cl == ConsistencyLevel.ALL:
        return n
    return n // 2 + 1


@dataclass
class Cluster:
    """The replicas, the simulated clock and the per-partition Paxos state."""

    rng: random.Random
    faults: Faults = field(default_factory=Faults)
    n: int = 3
    now_us: int = 1_700_000_000_000_000
    replicas: list[Replica] = field(default_factory=list)
    hints: list[tuple[int, Mutation]] = field(default_factory=list)
    ballots: dict[tuple[str, tuple[Any, ...]], int] = field(default_factory=dict)
    proposals: dict[tuple[str, tuple[Any, ...]], Mutation] = field(default_factory=dict)
    landed: set[int] = field(default_factory=set)  # ids of mutations some replica holds
    changes: int = 0  # moves whenever any replica's data may have changed
    # Every write that reached a replica, applied once (after the hooks that see the cluster
    # as it was before it): what the replicas hold merged (their data only ever comes from
    # these writes), kept for `truth`, which adds the hints of writes that reached none yet.
    union: Replica = field(default_factory=Replica)
    # The mutations `union` holds, by id (held here, so that no id is reused meanwhile).
    in_union: dict[int, Mutation] = field(default_factory=dict)
    # Called once per mutation when it first takes effect (reaches a replica, or commits).
    on_effect: list[Callable[[Mutation], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.replicas = [Replica() for _ in range(self.n)]

    # ---- writes ----
    def _land(self, i: int, m: Mutation) -> None:
        if id(m) not in self.landed:  # the hooks see the cluster as it was before
            self.landed.add(id(m))
            for hook in self.on_effect:
                hook(m)
        self.changes += 1
        self._unite(m)
        for op in m.ops:
            self.replicas[i].apply(op, m.ts)

    def _unite(self, m: Mutation) -> None:
        if id(m) not in self.in_union:
            self.in_union[id(m)] = m
            for op in m.ops:
                self.union.apply(op, m.ts)

    def write(self, m: Mutation, cl: int, batch: bool) -> None:
        """A plain write (or unconditional batch) at consistency `cl`."""
        self.changes += 1
        now = 0
        for i in self.rng.sample(range(self.n), self.n):
            roll = self.rng.random()
            if roll < self.faults.replica_never:
                continue
            if roll < self.faults.replica_never + self.faults.replica_late:
                self.hints.append((i, m))
            else:
                self._land(i, m)
                now += 1
        if now < _required(cl, self.n) or self.rng.random() < self.faults.write_timeout:
            wt = WriteType.BATCH if batch else WriteType.SIMPLE
            raise WriteTimeout(
                "simulated",
                consistency=cl,
                required_responses=_required(cl, self.n),
                received_responses=now,
                write_type=wt,
            )

    def deliver_hint(self) -> bool:
        """Deliver one pending hint the seed picks; False when there is none."""
        if not self.hints:
            return False
        i, m = self.hints.pop(self.rng.randrange(len(self.hints)))
        self._land(i, m)
        return True

    def deliver_all(self) -> None:
        while self.deliver_hint():
            pass
        for key in list(self.proposals):
            self._complete(key)

    # ---- reads ----
    def read(self, table: str, pk: tuple[Any, ...] | None, cl: int) -> dict[tuple[Any, ...], Part]:
        """The partitions (one, or the whole table when `pk` is None) as the replicas a read
        at `cl` asks see them, merged; quorum reads repair what they asked."""
        if cl in SERIALS:
            if pk is not None:
                self._complete((table, pk))
            cl = ConsistencyLevel.QUORUM
        if self.rng.random() < self.faults.read_timeout:
            raise ReadTimeout(
                "simulated",
                consistency=cl,
                required_responses=2,
                received_responses=1,
                data_retrieved=False,
            )
        asked = self.rng.sample(range(self.n), _required(cl, self.n))
        keys = (
            [pk]
            if pk is not None
            else sorted(
                {k for i in asked for k in self.replicas[i].tables.get(table, {})}, key=repr
            )
        )
        out = {}
        for key in keys:
            merged = Part()
            for i in asked:
                got = self.replicas[i].tables.get(table, {}).get(key)
                if got is not None:
                    merged.merge(got)
            if len(asked) > 1:
                self.changes += 1
                for i in asked:
                    self.replicas[i].part(table, key).merge(merged)
            out[key] = merged
        return out

    def truth(self, table: str, pk: tuple[Any, ...]) -> Part:
        """Everything any replica holds or will hold (pending hints included): what the
        cluster converges to; for the invariant checkers only, which must not change it."""
        held = self.union.tables.get(table, {}).get(pk)
        pending = [m for _, m in self.hints if id(m) not in self.in_union]
        if not pending:
            return held or Part()
        merged = Part()
        if held is not None:
            merged.merge(held)
        for m in pending:
            for op in m.ops:
                if op[1] == table and op[2] == pk:
                    extra = Replica()
                    extra.apply(op, m.ts)
                    merged.merge(extra.part(table, pk))
        return merged

    # ---- lightweight transactions ----
    def _complete(self, key: tuple[str, tuple[Any, ...]]) -> None:
        m = self.proposals.pop(key, None)
        if m is not None:
            self._commit(m)

    def _commit(self, m: Mutation) -> None:
        quorum = self.rng.sample(range(self.n), _required(ConsistencyLevel.QUORUM, self.n))
        for i in range(self.n):
            if i in quorum:
                self._land(i, m)
            else:
                self.hints.append((i, m))

    def cas(
        self,
        key: tuple[str, tuple[Any, ...]],
        decide: Callable[[Part, int], tuple[bool, list[Any], Mutation | None]],
        cl: int,
    ) -> list[Any]:
        """One lightweight transaction on partition `key`: `decide(merged, ballot_ts)` says
        whether its conditions hold, the result rows and the mutation to commit."""
        self._complete(key)
        ballot = max(self.now_us, self.ballots.get(key, 0) + 1)
        self.ballots[key] = ballot
        merged = self.read(key[0], key[1], ConsistencyLevel.QUORUM)[key[1]]
        ok, rows, m = decide(merged, ballot)
        if self.rng.random() < self.faults.cas_unknown:
            fate = self.rng.choice(("lost", "applied", "accepted"))
            if ok and m is not None and fate == "applied":
                self._commit(m)
            elif ok and m is not None and fate == "accepted":
                self.proposals[key] = m
            raise WriteTimeout(
                "simulated",
                consistency=cl,
                required_responses=2,
                received_responses=0,
                write_type=WriteType.CAS,
            )
        if ok and m is not None:
            self._commit(m)
        return rows

    @staticmethod
    def check_batch(parts: int, size: int, conditional: bool) -> None:
        if conditional and parts > 1:
            raise InvalidRequest("Batch with conditions cannot span multiple partitions")
        if parts > 1 and size > BATCH_FAIL_BYTES:
            raise InvalidRequest(f"Batch too large ({size} bytes)")
