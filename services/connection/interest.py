"""Which tenants other nodes listen to on the mesh, so a node puts a message on NATS only when
another node may want it (most of a node's per-message work, when its publishers and
subscribers are on the same node, was building NATS batches nobody read).

The summary is per tenant: a node "has interest" in a tenant while it holds any NATS
subscription for it (and for STICKY_S after the last one went, so a tenant whose clients
come and go does not pay the announcement each time). Other processes that read the mesh
(rules, bridges) must announce their interest the same way.

Why it is exact, never missing a message published after a SUBACK (a lease argument; only
durations measured on each node's own monotonic clock are compared):
- Every node sends itself a numbered tick on `mi.tick.<node>` every window / 4, through the
  same NATS subscription that carries the announcements, and its whole set of tenants on
  `mi.state` every STATE_EVERY_S (both driven by its publishes as well as by timers, which
  run late on a saturated loop). When a tick comes back, every announcement the server
  routed before it has been handled; the tick's send time becomes `fresh_at`.
- A node skips the NATS publish for a tenant only if no other node announced interest in it,
  it holds no shared group of it (NATS picks shared members, its own too), and
  `now - fresh_at < window`.
- A node that gains interest in a tenant publishes an announcement on `mi.add` and waits
  for NATS to confirm it (PING/PONG: routed to every subscriber's connection). Then the
  SUBACK may go once every node that could be skipping has answered the announcement from
  that same subscription (it has handled it), or once `window` (plus 10%) has passed: a node
  that did not answer and skips a publish arriving after that had a tick sent after the
  announcement was routed, so it handled the announcement first. Nodes that could be
  skipping are those heard from within 3 * STATE_EVERY_S (one that said nothing for that
  long sent no tick either for more than a window, STATE_EVERY_S being over window / 2),
  and only once the announcer has been up long enough to have heard them all.
- A late tick only stops the skipping until a fresh one returns. A lost one (numbered: NATS
  dropped messages of a slow consumer), a NATS reconnection (what was announced meanwhile
  never arrives) and the start of the node make it publish everything until it has heard
  every node's full state once more; a node's entries expire after three periods of silence.
`window_s` 0 turns the summary off: every message goes on NATS, as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus import subjects
from services.common.bus.flushing import flushed

log = logging.getLogger("starling.connection.interest")

STATE_EVERY_S = 2.0
STICKY_S = 300.0
_MARGIN = 1.1  # the announcer waits this much longer than the others trust a tick
_SILENT_S = 3 * STATE_EVERY_S  # a node not heard from for this long is gone


class MeshInterest:
    def __init__(self, nc: Client, node_id: str, window_s: float) -> None:
        """`nc` must deliver this node's own publishes back to it (no `no_echo`)."""
        self._nc = nc
        self._node_id = node_id
        self._window = window_s
        self._local: set[str] = set()  # tenants this node holds NATS subscriptions for
        # Tenants with shared subscriptions here: NATS picks their member (queue groups),
        # this node's own included, so their messages always go on NATS.
        self._shared: set[str] = set()
        self._idle_since: dict[str, float] = {}  # tenant -> when its last one went
        self._announcing: dict[str, asyncio.Future[None]] = {}
        self._remote: dict[str, dict[str, float]] = {}  # tenant -> node -> heard at
        now = time.monotonic()
        self._fresh_at = -1e9
        self._tick_sent = 0  # ticks are numbered, to see one lost
        self._tick_seen = 0
        self._tick_at = -1e9  # when the last tick was sent
        self._state_at = -1e9  # when the last full state was sent
        self._reconnects = 0
        self._started = now
        self._trusted_from = now + 1.5 * STATE_EVERY_S
        self._nodes: dict[str, float] = {}  # other nodes -> last heard from
        self._tick_subject = subjects.mesh_interest_tick(node_id)
        self._loop_task: asyncio.Task[None] | None = None
        # At most one maintenance under way: many publishes of one loop turn find it due.
        self._maintaining: asyncio.Future[None] | None = None
        self.skipped = 0  # messages not put on NATS (for tests and stats)

    @property
    def enabled(self) -> bool:
        return self._window > 0

    async def start(self) -> None:
        if not self.enabled:
            return
        await self._nc.subscribe(subjects.MESH_INTEREST_ALL, cb=self._on_message)
        self._reconnects = self._nc.stats["reconnects"]
        self._started = time.monotonic()
        self._trusted_from = self._started + 1.5 * STATE_EVERY_S
        self._loop_task = asyncio.create_task(self._maintain_loop(), name="interest")

    async def stop(self) -> None:
        for t in (self._loop_task, self._maintaining):
            if t is not None:
                t.cancel()

    def wanted_elsewhere(self, tenant: str) -> bool:
        """May another node want this tenant's messages? (True when unsure.)"""
        if not self.enabled:
            return True
        now = time.monotonic()
        due = now - self._tick_at >= self._window / 4 or now - self._state_at >= STATE_EVERY_S
        if due and (self._maintaining is None or self._maintaining.done()):
            # Under load timers run late: the publishes themselves keep these going.
            self._maintaining = asyncio.ensure_future(self._maintain())
        if now - self._fresh_at >= self._window or now < self._trusted_from:
            return True
        return tenant in self._remote or tenant in self._shared

    async def hold(self, tenant: str) -> None:
        """This node holds NATS subscriptions for `tenant`; returns once every other node
        will publish the tenant's messages (the SUBACK may go out)."""
        new = tenant not in self._local
        self._local.add(tenant)
        sticky = self._idle_since.pop(tenant, None)
        if not self.enabled:
            return
        pending = self._announcing.get(tenant)
        if pending is None and new and not self._still_announced(sticky):
            pending = asyncio.ensure_future(self._announce(tenant))
            self._announcing[tenant] = pending
            pending.add_done_callback(lambda _: self._announcing.pop(tenant, None))
        if pending is not None:
            await asyncio.shield(pending)

    def shared(self, tenant: str, held: bool) -> None:
        """Whether this node holds shared subscriptions of `tenant`."""
        if held:
            self._shared.add(tenant)
        else:
            self._shared.discard(tenant)

    def release(self, tenant: str) -> None:
        """This node holds no more NATS subscriptions for `tenant` (it stays announced for
        STICKY_S)."""
        if tenant in self._local:
            self._local.discard(tenant)
            self._idle_since[tenant] = time.monotonic()

    @staticmethod
    def _still_announced(idle_since: float | None) -> bool:
        """Still in this node's state (sticky after its last subscription went)."""
        return idle_since is not None and time.monotonic() - idle_since < STICKY_S

    def _tenants(self) -> list[str]:
        now = time.monotonic()
        for t in [t for t, since in self._idle_since.items() if now - since >= STICKY_S]:
            del self._idle_since[t]
        return sorted({*self._local, *self._idle_since})

    async def _announce(self, tenant: str) -> None:
        body = json.dumps({"node": self._node_id, "tenants": [tenant]}).encode()
        inbox = self._nc.new_inbox()
        answered: set[str] = set()
        everyone = asyncio.Event()
        now = time.monotonic()
        # Who could be skipping; unknown while this node may not have heard everyone yet.
        expected = (
            {n for n, heard in self._nodes.items() if now - heard < _SILENT_S}
            if now - self._started >= 1.5 * STATE_EVERY_S
            else None
        )

        async def on_answer(msg: Msg) -> None:
            answered.add(msg.data.decode())
            if expected is not None and answered >= expected:
                everyone.set()

        sub = await self._nc.subscribe(inbox, cb=on_answer)
        try:
            await self._nc.publish(subjects.MESH_INTEREST_ADD, body, reply=inbox)
            await flushed(self._nc, 5)
            if expected is not None and not expected:
                return
            try:
                await asyncio.wait_for(everyone.wait(), self._window * _MARGIN + 0.005)
            except TimeoutError:
                pass  # the window passed: whoever did not answer no longer skips
        finally:
            await sub.unsubscribe()

    async def _on_message(self, msg: Msg) -> None:
        if msg.subject.startswith(subjects.MESH_INTEREST_TICK_PREFIX):
            if msg.subject == self._tick_subject:
                self._on_tick(msg.data)
            return
        try:
            body = json.loads(msg.data)
            node, tenants = str(body["node"]), [str(t) for t in body["tenants"]]
        except (ValueError, KeyError, TypeError):
            log.warning("interest_malformed", extra={"subject": msg.subject})
            return
        if node == self._node_id:
            return
        now = time.monotonic()
        self._nodes[node] = now
        full = msg.subject == subjects.MESH_INTEREST_STATE
        if full:  # the node's whole set: what it no longer lists is gone
            listed = set(tenants)
            for t in [t for t, nodes in self._remote.items() if node in nodes and t not in listed]:
                self._forget(t, node)
        for t in tenants:
            self._remote.setdefault(t, {})[node] = now
        if msg.reply:  # handled, in order with this node's ticks: the SUBACK may go
            await self._nc.publish(msg.reply, self._node_id.encode())

    def _forget(self, tenant: str, node: str) -> None:
        nodes = self._remote.get(tenant)
        if nodes is not None:
            nodes.pop(node, None)
            if not nodes:
                del self._remote[tenant]

    def _distrust(self) -> None:
        """Announcements may have been missed: trust the summary again only once every
        node's full state came in since."""
        self._trusted_from = max(self._trusted_from, time.monotonic() + 1.5 * STATE_EVERY_S)

    def _on_tick(self, data: bytes) -> None:
        seq, sent_at = data.split()
        if int(seq) != self._tick_seen + 1:
            self._distrust()  # a tick was lost, so may an announcement have been
        self._tick_seen = int(seq)
        self._fresh_at = max(self._fresh_at, float(sent_at))

    async def _maintain(self) -> None:
        """A tick when one is due, the full state when it is due."""
        now = time.monotonic()
        tick = now - self._tick_at >= self._window / 4
        state = now - self._state_at >= STATE_EVERY_S
        if tick:
            self._tick_at = now
            if self._nc.stats["reconnects"] != self._reconnects:
                self._reconnects = self._nc.stats["reconnects"]
                self._distrust()
            self._tick_sent += 1
        if state:
            self._state_at = now
            self._expire(now)
        try:
            if tick:
                body = f"{self._tick_sent} {now!r}".encode()
                await self._nc.publish(self._tick_subject, body)
            if state:
                full = json.dumps({"node": self._node_id, "tenants": self._tenants()})
                await self._nc.publish(subjects.MESH_INTEREST_STATE, full.encode())
        except Exception:  # disconnected: ticks stop coming back, nothing is skipped
            log.debug("interest_publish_failed")

    def _expire(self, now: float) -> None:
        for node in [n for n, heard in self._nodes.items() if now - heard > _SILENT_S]:
            del self._nodes[node]
            for t in [t for t, nodes in self._remote.items() if node in nodes]:
                self._forget(t, node)

    async def _maintain_loop(self) -> None:
        while True:
            await self._maintain()
            await asyncio.sleep(self._window / 4)
