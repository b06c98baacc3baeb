"""The session, ban, retained, rule and token stores' real Cassandra code under the
deterministic simulation (tests/simulation/__init__.py), with its faults: replicas late or
never written, timeouts, unknown compare-and-set outcomes, pauses and each process's own
skewed clock.

Invariants: a clear followed by a set (by one process) is never reversed, for every row that
issue 36 took off mixed LWT and plain writes (the stores from before it reverse some, here
reproduced by putting the LWT delete back); two session instances racing to open one client
id never both win one incarnation; the expiry sweep finds each expired session once and no
live one. Run alone with `pytest -m simulation`.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from cassandra import ConsistencyLevel, DriverException

from services.common.bans import Ban, BanKind
from services.common.store import cassandra_session_expiry
from services.common.store.cassandra_bans import CassandraBanStore
from services.common.store.cassandra_router import CassandraRouterStore
from services.common.store.cassandra_rules import CassandraRuleStore
from services.common.store.cassandra_session import CassandraSessionStore
from services.common.store.cassandra_tokens import CassandraTokenStore
from services.common.store.ports_auth import AdminTokenRecord
from services.common.store.ports_router import RetainedRecord
from services.common.store.ports_rules import RuleRecord
from services.common.store.ports_session import SessionRecord
from tests.simulation.cluster import Cluster, Faults
from tests.simulation.scheduler import Scheduler
from tests.simulation.session import SimBatch, SimSession

pytestmark = pytest.mark.simulation
SEEDS = int(os.environ.get("STARLING_SIM_SEEDS", "1500")) // 15  # 100 by default
MODEL_START_MS = Cluster(random.Random(0)).now_us // 1000
FAULTS = Faults(write_timeout=0.02, cas_unknown=0.05)  # the defaults otherwise


class World:
    """One seeded model cluster, scheduler and session; stores built on it."""

    def __init__(self, seed: int, migrations: Any) -> None:
        rng = random.Random(seed)
        self.cluster = Cluster(random.Random(rng.getrandbits(64)), FAULTS)
        self.sched = Scheduler(random.Random(rng.getrandbits(64)))
        self.sched.on_step.append(self._tick)
        self.session = SimSession(self.cluster, self.sched, ConsistencyLevel.LOCAL_QUORUM)
        self.session.create(migrations)

    def _tick(self) -> None:
        self.cluster.now_us += 1000

    def store(self, cls: Any) -> Any:
        return cls.on_session(self.session, ConsistencyLevel.SERIAL, SimBatch)

    def run(self, procs: dict[str, Awaitable[None]]) -> None:
        asyncio.run(self.sched.run(procs, 200_000))  # type: ignore[arg-type]


# ---- clear, then set ----------------------------------------------------------------------

# Per store: (class, clear(store, key), set(store, key, value), read(store, key) -> value).
Op = Callable[..., Awaitable[Any]]


def _ban(key: str, value: str) -> Ban:
    return Ban(kind=BanKind.CLIENT_ID, tenant="t", value=key, reason=value, created_at_ms=1)


async def _ban_read(s: Any, key: str) -> str | None:
    return next((b.reason for b in await s.list() if b.value == key), None)


async def _retained_read(s: Any, key: str) -> str | None:
    got = [r.data.decode() for r in await s.tenant_retained("t") if r.topic == key]
    return got[0] if got else None


async def _rule_read(s: Any, key: str) -> str | None:
    r = await s.get_rule("t", key)
    return r.description if r else None


async def _token_read(s: Any, key: str) -> str | None:
    r = await s.get_token(key)
    return r.description if r else None


async def _session_read(s: Any, key: str) -> str | None:
    r = await s.get_session("t", key)
    return r.owner if r else None


async def _session_clear(s: Any, key: str) -> None:
    r = await s.get_session("t", key)
    if r is not None:
        await s.delete_session("t", key, r.incarnation)


STORES: dict[str, tuple[Any, Op, Op, Op]] = {
    "bans": (
        CassandraBanStore,
        lambda s, k: s.remove(BanKind.CLIENT_ID, "t", k),
        lambda s, k, v: s.put(_ban(k, v), 0),
        _ban_read,
    ),
    "retained": (
        CassandraRouterStore,
        lambda s, k: s.delete_retained("t", k),
        lambda s, k, v: s.put_retained(RetainedRecord("t", k, v.encode())),
        _retained_read,
    ),
    "rules": (
        CassandraRuleStore,
        lambda s, k: s.delete_rule("t", k),
        lambda s, k, v: s.put_rule(RuleRecord("t", k, "SELECT * FROM 'a'", "[]", True, 1, 1, v)),
        _rule_read,
    ),
    "tokens": (
        CassandraTokenStore,
        lambda s, k: s.delete_token(k),
        lambda s, k, v: s.put_token(AdminTokenRecord(k, "t", "h", 1, 0, v)),
        _token_read,
    ),
    "sessions": (
        CassandraSessionStore,
        _session_clear,
        lambda s, k, v: s.put_session(SessionRecord("t", k, 1, 60, True, owner=v)),
        _session_read,
    ),
}


def clear_then_set(seed: int, kind: str, cls: Any = None) -> list[str]:
    """Two processes, each clearing then setting its own keys three times over, on one
    seeded world; the keys whose last acknowledged set is not what is read afterwards."""
    base, clear, put, read = STORES[kind]
    w = World(seed, base.migrations)
    store = w.store(cls or base)
    last: dict[str, str] = {}
    reversed_keys: list[str] = []

    async def writer(me: str) -> None:
        for i in range(3):
            for k in (f"{me}-a", f"{me}-b"):
                try:
                    await clear(store, k)
                    await put(store, k, f"{me}{i}")
                    last[k] = f"{me}{i}"
                except DriverException:
                    last.pop(k, None)  # an unknown outcome: nothing promised for this key

    async def check() -> None:
        for k, v in last.items():
            for _ in range(5):  # a read that times out says nothing: ask again
                try:
                    got = await read(store, k)
                except DriverException:
                    continue
                if got != v:
                    reversed_keys.append(f"{k}: set {v!r}, read {got!r}")
                break

    w.run({"p1": writer("p1"), "p2": writer("p2")})
    w.run({"check": check()})
    return reversed_keys


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_clear_followed_by_a_set_is_never_reversed(kind: str) -> None:
    for seed in range(SEEDS):
        assert clear_then_set(seed, kind) == [], f"seed {seed}"


class LwtClearBans(CassandraBanStore):
    """The ban store's removal as it was before issue 36: a lightweight transaction on a row
    that `put` writes plainly."""

    def prepare(self) -> None:
        super().prepare()
        self._lwt_del = self._session.prepare(
            "DELETE FROM ban_shards WHERE shard=? AND kind=? AND tenant=? AND value=? IF EXISTS"
        )

    async def remove(self, kind: BanKind, tenant: str, value: str) -> bool:
        from services.common.store.cassandra_bans import shard_of

        key = (shard_of(int(kind), tenant, value), int(kind), tenant, value)
        rows = await self._exec(self._lwt_del, key)
        await self._changed()
        return bool(rows and rows[0][0])


def test_an_lwt_clear_before_a_plain_set_comes_out_reversed() -> None:
    """The mixing the fix removed: the delete's Paxos ballot is the coordinator's clock, the
    set's timestamp the writer's (skewed behind): last write wins hands it to the delete."""
    broken = [s for s in range(SEEDS) if clear_then_set(s, "bans", LwtClearBans)]
    assert broken, "no seed reversed a set: the simulation no longer models the clocks"


# ---- sessions -----------------------------------------------------------------------------


def open_race(seed: int) -> tuple[list[tuple[int, str]], SessionRecord | None]:
    """Three session instances opening one client id (read, then compare-and-set the next
    incarnation), twice each; the acknowledged opens and the record left."""
    w = World(seed, CassandraSessionStore.migrations)
    store = w.store(CassandraSessionStore)
    won: list[tuple[int, str]] = []
    final: list[SessionRecord | None] = []

    async def opener(me: str) -> None:
        for _ in range(2):
            try:
                cur = await store.get_session("t", "c")
                new = SessionRecord("t", "c", (cur.incarnation if cur else 0) + 1, 60, True)
                if await store.replace_session(new, cur):
                    won.append((new.incarnation, me))
            except DriverException:
                pass  # unknown: this instance claims nothing

    async def look() -> None:
        for _ in range(10):  # a read that times out says nothing: ask again
            try:
                final.append(await store.get_session("t", "c"))
                return
            except DriverException:
                continue

    w.run({p: opener(p) for p in ("s1", "s2", "s3")})
    w.run({"look": look()})
    return won, final[0]


def test_racing_opens_never_share_an_incarnation() -> None:
    for seed in range(SEEDS):
        won, final = open_race(seed)
        incarnations = [inc for inc, _ in won]
        assert len(incarnations) == len(set(incarnations)), f"seed {seed}: {won}"
        assert won and final is not None and final.incarnation >= max(incarnations), seed


def sweeps(seed: int) -> list[list[str]]:
    """Six sessions put (the even ones expired a minute ago, the odd ones connected), then
    sweeps until they found every expired one (a shard that timed out is swept next time);
    what each found. Nothing discards them, so each sweep may find them again."""
    w = World(seed, CassandraSessionStore.migrations)
    store = w.store(CassandraSessionStore)
    now = w.cluster.now_us // 1000
    got: list[list[str]] = []

    async def setup() -> None:
        for i in range(6):
            rec = SessionRecord("t", f"c{i}", 1, 1, i % 2 == 1, now - 61_000)
            for _ in range(8):  # a timeout: try again (the record is the same)
                try:
                    await store.put_session(rec)
                    break
                except DriverException:
                    continue

    async def sweep() -> None:
        for _ in range(20):
            try:
                got.append([r.client_id for r in await store.expired_sessions(now)])
            except DriverException:
                continue
            if set().union(*got) == EXPIRED:
                return

    w.run({"setup": setup()})
    w.run({"sweep": sweep()})
    return got


EXPIRED = {"c0", "c2", "c4"}


def test_the_sweep_finds_each_expired_session_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The index's "wall clock" is the model's (nothing in a run reads the real one).
    monkeypatch.setattr(cassandra_session_expiry, "_wall_ms", lambda: MODEL_START_MS)
    for seed in range(SEEDS // 4):
        found = sweeps(seed)
        assert set().union(*found) == EXPIRED, f"seed {seed}: {found}"
        for one in found:  # no live session, none twice in one sweep
            assert len(one) == len(set(one)) and set(one) <= EXPIRED, f"seed {seed}: {found}"
