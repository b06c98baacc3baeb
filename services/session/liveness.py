"""Connection-node liveness: what to do with the clients of a node that died.

Nodes publish a heartbeat on `hb.node.<node_id>` every second. A node silent for
`node_timeout_s` is declared dead: every client the registry says it held is released, and
its persistent session is parked as disconnected at the node's last heartbeat, so session
expiry runs even when a SIGKILLed node's clients never come back, and its figures in the
tenants' subscription counts are removed (services/common/subscription_counts.py). Nodes
named in the registry's set of nodes holding clients count as seen from the moment this
service learns of them (at start, and on every check), so a node that died while the session
service was down, or before its first heartbeat or hello reached this service, is found too.
The wills its entries kept are published (services/session/wills.py), each by the one
instance whose release of the entry succeeded, a chunk at a time as the entries are released.

Who decides a node is silent: not this instance alone. A heartbeat any instance hears is
recorded in Redis (`SeenRecords`: a hash field per node holding the Redis server's time,
written by a script that reads TIME) and a heartbeat sent as a request is answered: "ok"
or "new" once that write succeeded, "unwritten" when it failed or took longer than
RECORD_WAIT_S (Redis away or slow: a Redis outage must not fence every node). The answer
renews the node's lease on its clients (services/connection/lease.py, whose docstring has
the safety argument and its holes). A node is released only when (a) this instance has not
heard it for `node_timeout_s`, (b) the shared record is older than that by Redis's clock,
claimed by one script that marks the record as being released (`r<time>`), and (c) this
instance's liveness calls to Redis have all succeeded for `node_timeout_s` (`RedisStreak`:
a failure, a call slower than its limit or a gap of MAX_GAP_S between successes starts it
again; a (re)started instance starts with none). So no instance releases a node that some
instance answered, written or not, in the last `node_timeout_s`: (b) keeps an instance on
the wrong side of a NATS split from releasing a node another instance still hears and
records; (a) and (c) keep an instance from releasing a node answered while Redis was out.
While a release runs (its mark younger than RELEASE_GUARD_MS, refreshed a chunk at a time)
heartbeats of that node are not answered, and an unwritten answer does not end a fence, so
the node stays fenced until its release is over; then the record goes, and the next
heartbeat writes a new one and is answered "new": the node re-asserts what it holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import Redis

from services.common.bus import subjects
from services.session.registry import Holder, Registry
from services.session.sessions import Sessions
from services.session.wills import StoredWills

log = logging.getLogger("starling.session.liveness")

# Wills of a dead node go out this many at a time as its entries are released (not after
# all of them): a client that comes back meanwhile finds its delayed will at the router.
WILL_CHUNK = 64
SEEN_KEY = "st:nodes:seen"  # node id -> Redis time (ms) last heard, or "r<ms>": releasing
# A release mark older than this is taken for a releaser that died: claimed again.
RELEASE_GUARD_MS = 30_000
# Heartbeats being recorded at once; past it they are answered unwritten (Redis slow or away).
MAX_RECORDING = 256
# The answer to a heartbeat whose node had no record (the node re-asserts its clients);
# services/connection/lease.py NEW_RECORD.
NEW_RECORD = b"new"
HEARD = b"ok"
# The answer when the write failed or was too slow (lease.py UNWRITTEN): the node's lease
# is renewed if it still runs, but a fenced node stays fenced.
UNWRITTEN = b"unwritten"
# Time limits of this instance's liveness calls to Redis (lease.py: an outage that fails
# a heartbeat's write breaks the streak of every instance that calls Redis meanwhile).
RECORD_WAIT_S = 3.0  # a heartbeat's write; the node waits `self_fence_s` for the answer
CALL_WAIT_S = 1.0  # any other Redis call of a liveness check
# The check makes calls every second; a longer gap between successes restarts the streak.
MAX_GAP_S = 2.5
T = TypeVar("T")

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""
# KEYS[1] the hash; ARGV node, guard ms. -1: being released (no answer); 0: a new record; 1.
_HEARD = (
    _NOW
    + """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and string.sub(cur, 1, 1) == 'r' then
  if now - tonumber(string.sub(cur, 2)) < tonumber(ARGV[2]) then return -1 end
  cur = false
end
redis.call('HSET', KEYS[1], ARGV[1], now)
if cur then return 1 end
return 0
"""
)
# KEYS[1] the hash; ARGV nodes: each without a record gets one (seen from now). Returns now.
_LEARN = (
    _NOW
    + """
for i = 1, #ARGV do redis.call('HSETNX', KEYS[1], ARGV[i], now) end
return now
"""
)
# KEYS[1] the hash; ARGV timeout ms, guard ms, not after (ms), nodes. Returns, flat, for
# each node claimed (record older than the timeout, or a stale release mark): node, its
# record's time, the mark set; and, for each node without a record, node, '', ''. Nothing
# when run after `not after` (sent before an outage, run when it ended: its caller gave up).
_CLAIM = (
    _NOW
    + """
local out = {}
if now > tonumber(ARGV[3]) then return out end
for i = 4, #ARGV do
  local node = ARGV[i]
  local cur = redis.call('HGET', KEYS[1], node)
  if not cur then
    table.insert(out, node); table.insert(out, ''); table.insert(out, '')
  else
    local marked = string.sub(cur, 1, 1) == 'r'
    local at = tonumber(marked and string.sub(cur, 2) or cur)
    local limit = tonumber(marked and ARGV[2] or ARGV[1])
    if now - at > limit then
      local mark = 'r' .. now
      redis.call('HSET', KEYS[1], node, mark)
      table.insert(out, node); table.insert(out, tostring(at)); table.insert(out, mark)
    end
  end
end
return out
"""
)
# KEYS[1] the hash; ARGV node, mark. The release is over: the record goes (if still ours).
_DONE = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
"""
# KEYS[1] the hash; ARGV node, mark. A long release keeps its mark young; returns the new one.
_KEEP = (
    _NOW
    + """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return false end
local mark = 'r' .. now
redis.call('HSET', KEYS[1], ARGV[1], mark)
return mark
"""
)


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


class SeenRecords:
    """When each node was last heard by any session instance, by Redis's clock."""

    def __init__(self, redis: Redis, key: str = SEEN_KEY) -> None:
        self._key = key
        self._heard = redis.register_script(_HEARD)
        self._learn = redis.register_script(_LEARN)
        self._claim = redis.register_script(_CLAIM)
        self._done = redis.register_script(_DONE)
        self._keep = redis.register_script(_KEEP)
        self._redis = redis

    async def heard(self, node: str) -> int:
        """Record a heartbeat: 1 recorded, 0 recorded as new, -1 being released."""
        return int(await self._heard(keys=[self._key], args=[node, RELEASE_GUARD_MS]))

    async def learn(self, nodes: list[str]) -> int:
        """Give each of `nodes` without a record one; returns Redis's time (ms)."""
        return int(await self._learn(keys=[self._key], args=nodes))

    async def nodes(self) -> list[str]:
        return [_text(n) for n in await self._redis.hkeys(self._key)]  # type: ignore[misc]

    async def claim(
        self, nodes: list[str], timeout_s: float, not_after_ms: int | None = None
    ) -> tuple[list[tuple[str, int, str]], list[str]]:
        """Claim the release of those of `nodes` silent for `timeout_s` by the shared
        record: (node, its record's time in ms, the release mark), and the nodes with no
        record (released by another instance meanwhile). None of it when the script runs
        after `not_after_ms` (Redis's time)."""
        if not nodes:
            return [], []
        limit = not_after_ms if not_after_ms is not None else 2**52
        args: list[str | int] = [int(timeout_s * 1000), RELEASE_GUARD_MS, limit, *nodes]
        flat = [_text(v) for v in await self._claim(keys=[self._key], args=args)]
        claimed, gone = [], []
        for i in range(0, len(flat), 3):
            node, at, mark = flat[i : i + 3]
            if mark:
                claimed.append((node, int(at), mark))
            else:
                gone.append(node)
        return claimed, gone

    async def keep(self, node: str, mark: str) -> str:
        """A long release refreshes its mark (returns the new one, or "" if not ours)."""
        out = await self._keep(keys=[self._key], args=[node, mark])
        return _text(out) if out else ""

    async def done(self, node: str, mark: str) -> None:
        await self._done(keys=[self._key], args=[node, mark])


class RedisStreak:
    """Since when every Redis call made through it has succeeded within its limit, with no
    more than MAX_GAP_S between two successes (an outage may have gone unseen in a longer
    gap), by this instance's clock. lease.py has why this is enough."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since: float | None = None
        self._last_ok = 0.0

    async def call(self, aw: Awaitable[T], limit_s: float) -> T:
        try:
            out = await asyncio.wait_for(aw, limit_s)
        except BaseException:  # failed, too slow, or cancelled: the streak starts again
            self.broken()
            raise
        now = self._clock()
        if self._since is None or now - self._last_ok > MAX_GAP_S:
            if self._since is None:
                log.info("liveness_redis_working")
            self._since = now
        self._last_ok = now
        return out

    def broken(self) -> None:
        if self._since is not None:
            log.warning("liveness_redis_failing")
        self._since = None

    def held_for(self) -> float:
        """Seconds of the streak so far (0 while failing, or after a gap)."""
        now = self._clock()
        if self._since is None or now - self._last_ok > MAX_GAP_S:
            return 0.0
        return now - self._since


class NodeLiveness:
    def __init__(
        self,
        *,
        registry: Registry,
        sessions: Sessions,
        timeout_s: float,
        drop_subscriptions: Callable[[str], Awaitable[None]] | None = None,
        wills: StoredWills | None = None,
        seen: SeenRecords | None = None,
    ) -> None:
        """`seen`: the shared records (SeenRecords on the registry's Redis)."""
        self._registry = registry
        self._wills = wills
        self._drop_subscriptions = drop_subscriptions
        self._sessions = sessions
        self._timeout = timeout_s
        self._seen = seen
        self.last_seen: dict[str, float] = {}  # node id -> time.monotonic(), this instance
        self._recording: set[asyncio.Task[None]] = set()
        self._marks: dict[str, str] = {}  # node -> this instance's release mark on it
        self._nc: Any = None
        self.redis = RedisStreak()

    async def start(self, nc: Any) -> None:
        self._nc = nc
        now = time.monotonic()
        for node in await self.redis.call(self._registry.known_nodes(), CALL_WAIT_S):
            self.last_seen.setdefault(node, now)
        await nc.subscribe(subjects.NODE_HEARTBEATS, cb=self._on_heartbeat)
        await nc.subscribe(subjects.NODE_HELLOS, cb=self._on_hello)

    async def _on_heartbeat(self, msg: Any) -> None:
        node = msg.data.decode()
        self.last_seen[node] = time.monotonic()
        if self._seen is None:
            return
        if len(self._recording) >= MAX_RECORDING:  # Redis slow or away: not written
            self.redis.broken()
            if msg.reply:
                await self._nc.publish(msg.reply, UNWRITTEN)
            return
        # Not in this callback: a slow Redis must not hold up the other nodes' heartbeats.
        task = asyncio.get_running_loop().create_task(self._record(node, msg.reply))
        self._recording.add(task)
        task.add_done_callback(self._recording.discard)

    async def _record(self, node: str, reply: str) -> None:
        """Record the heartbeat in Redis, then answer it (renewing the node's lease): not
        while the node is being released; "unwritten" when the write failed."""
        assert self._seen is not None
        try:
            state = await self.redis.call(self._seen.heard(node), RECORD_WAIT_S)
        except Exception as exc:  # Redis away or slow: answered all the same
            log.debug("heartbeat_unrecorded", extra={"node": node, "error": repr(exc)})
            answer = UNWRITTEN
        else:
            if state < 0:  # being released: the node stays fenced
                return
            answer = NEW_RECORD if state == 0 else HEARD
        if reply:
            await self._nc.publish(reply, answer)

    async def _on_hello(self, msg: Any) -> None:
        """A node (re)started: whatever its previous life held is gone (since its last
        heartbeat, as far as this instance knows)."""
        node = msg.data.decode()
        died_at_ms = int((time.time() - self.silent_for(node)) * 1000)
        self.last_seen[node] = time.monotonic()
        await self.release_node(node, died_at_ms)

    def silent_for(self, node: str) -> float:
        """Seconds since the node's last heartbeat (0: never heard of)."""
        seen = self.last_seen.get(node)
        return time.monotonic() - seen if seen is not None else 0.0

    async def check(self) -> list[str]:
        """Declare silent nodes dead and release their clients; returns the dead nodes."""
        now = time.monotonic()
        call = self.redis.call
        known = await call(self._registry.known_nodes(), CALL_WAIT_S)
        redis_ms = 0
        if self._seen is not None:
            redis_ms = await call(self._seen.learn(known), CALL_WAIT_S)
            known = [*known, *await call(self._seen.nodes(), CALL_WAIT_S)]
        for node in known:
            self.last_seen.setdefault(node, now)
        silent = [n for n, seen in self.last_seen.items() if now - seen > self._timeout]
        if silent and self._seen is not None and self.redis.held_for() <= self._timeout:
            # (c): Redis failed here lately, so an instance may have answered a heartbeat
            # it could not record (lease.py): nothing is released yet.
            log.debug("liveness_release_deferred", extra={"silent_nodes": len(silent)})
            return []
        if self._seen is None:
            wall = time.time()
            claimed = [(n, int((wall - (now - self.last_seen[n])) * 1000), "") for n in silent]
        else:
            # A claim that reaches Redis only after an outage is void (no stray mark).
            not_after = redis_ms + int(2 * CALL_WAIT_S * 1000)
            claim = self._seen.claim(silent, self._timeout, not_after)
            claimed, gone = await call(claim, CALL_WAIT_S)
            for node in gone:  # released by another instance meanwhile
                self.last_seen.pop(node, None)
        for node, died_at_ms, mark in claimed:
            self.last_seen.pop(node, None)
            self._marks[node] = mark
            try:
                await self.release_node(node, died_at_ms)
            finally:
                mark = self._marks.pop(node, "")
                if self._seen is not None and mark:
                    await self._seen.done(node, mark)
        return [c[0] for c in claimed]

    async def release_node(self, node: str, died_at_ms: int) -> int:
        """Release every client the registry lists at `node` (the release mark this instance
        holds on its shared record, if any, kept young meanwhile)."""
        released = 0
        with_wills: list[Holder] = []
        for i, (tenant, client_id) in enumerate(await self._registry.held_by(node)):
            if i and i % WILL_CHUNK == 0:
                await self._keep_mark(node)
            holder = await self._registry.get(tenant, client_id)
            if holder is None or holder.node_id != node:
                continue  # reconnected elsewhere meanwhile
            if await self._registry.release(tenant, client_id, holder.epoch):
                await self._sessions.park(tenant, client_id, died_at_ms, holder.epoch)
                released += 1
                if holder.will and self._wills is not None:
                    with_wills.append(holder)
                    if len(with_wills) >= WILL_CHUNK:
                        await self._wills.publish(with_wills, died_at_ms)
                        with_wills = []
        if with_wills and self._wills is not None:
            await self._wills.publish(with_wills, died_at_ms)
        await self._registry.drop_node(node)
        if self._drop_subscriptions is not None:
            await self._drop_subscriptions(node)
        if released:
            log.warning("node_down", extra={"node": node, "released_clients": released})
        return released

    async def _keep_mark(self, node: str) -> None:
        mark = self._marks.get(node)
        if mark and self._seen is not None:
            self._marks[node] = await self._seen.keep(node, mark) or mark

    async def run(self, period_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.check()
            except Exception:  # keep watching; one failed pass must not stop it
                log.exception("liveness_check_failed")
