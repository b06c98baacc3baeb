"""Which tenants other nodes listen to on the mesh, so a node puts a message on NATS only when
another node may want it (most of a node's per-message work, when its publishers and
subscribers are on the same node, was building NATS batches nobody read).

The summary is per tenant: a node "has interest" in a tenant while it holds any NATS
subscription for it (and for STICKY_S after the last one went, so a tenant whose clients
come and go does not pay the announcement each time). Other processes that read the mesh
(rules, bridges) must announce their interest the same way.

Why it is exact, never missing a message published after a SUBACK (a lease argument; only
durations measured on each node's own monotonic clock are compared):
- A node that gains interest in a tenant publishes an announcement on `mi.add`, waits for
  NATS to confirm it (PING/PONG: the server has handed it to every subscriber's connection),
  then waits `window_s` (plus a margin) more before the SUBACK goes out.
- Every node sends itself a tick on `mi.tick.<node>` every window_s / 4, on the same
  connection and subscription as the announcements. When a tick comes back, every
  announcement the server routed before the tick has been handled; the tick's send time
  becomes `fresh_at`.
- A node skips the NATS publish for a tenant only if no other node announced interest in it
  and `now - fresh_at < window_s`. So a publish skipped at time t had a tick sent after
  t - window_s, i.e. after any SUBACK that came before t had its announcement routed: that
  announcement was handled first, and the tenant would not be skipped.
- A gap in the ticks (NATS reconnecting, the loop stalled) and the start of the node make it
  publish everything until it has heard every node's full state (`mi.state`, sent every
  STATE_EVERY_S) once more; a node's state entries expire after three periods without one.
`window_s` 0 turns the summary off: every message goes on NATS, as before.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus import subjects

log = logging.getLogger("starling.connection.interest")

STATE_EVERY_S = 2.0
STICKY_S = 300.0
_MARGIN = 1.1  # the announcer waits this much longer than the others trust a tick


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
        self._trusted_from = now + 1.5 * STATE_EVERY_S
        self._tasks: list[asyncio.Task[Any]] = []
        self.skipped = 0  # messages not put on NATS (for tests and stats)

    @property
    def enabled(self) -> bool:
        return self._window > 0

    async def start(self) -> None:
        if not self.enabled:
            return
        await self._nc.subscribe(subjects.MESH_INTEREST_ALL, cb=self._on_message)
        self._tasks = [
            asyncio.create_task(self._tick_loop(), name="interest-ticks"),
            asyncio.create_task(self._state_loop(), name="interest-state"),
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()

    def wanted_elsewhere(self, tenant: str) -> bool:
        """May another node want this tenant's messages? (True when unsure.)"""
        if not self.enabled:
            return True
        now = time.monotonic()
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
        await self._nc.publish(subjects.MESH_INTEREST_ADD, body)
        await self._nc.flush(timeout=5)
        await asyncio.sleep(self._window * _MARGIN + 0.005)

    async def _on_message(self, msg: Msg) -> None:
        if msg.subject.startswith(subjects.MESH_INTEREST_TICK_PREFIX):
            if msg.subject == subjects.mesh_interest_tick(self._node_id):
                self._on_tick(float(msg.data))
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
        full = msg.subject == subjects.MESH_INTEREST_STATE
        if full:  # the node's whole set: what it no longer lists is gone
            listed = set(tenants)
            for t in [t for t, nodes in self._remote.items() if node in nodes and t not in listed]:
                self._forget(t, node)
        for t in tenants:
            self._remote.setdefault(t, {})[node] = now

    def _forget(self, tenant: str, node: str) -> None:
        nodes = self._remote.get(tenant)
        if nodes is not None:
            nodes.pop(node, None)
            if not nodes:
                del self._remote[tenant]

    def _on_tick(self, sent_at: float) -> None:
        now = time.monotonic()
        if now - self._fresh_at > self._window and self._fresh_at > 0:
            # A gap: announcements may have been missed (e.g. NATS reconnected). Trust the
            # summary again only once every node's full state came in since.
            self._trusted_from = max(self._trusted_from, now + 1.5 * STATE_EVERY_S)
        self._fresh_at = max(self._fresh_at, sent_at)

    async def _tick_loop(self) -> None:
        subject = subjects.mesh_interest_tick(self._node_id)
        while True:
            try:
                await self._nc.publish(subject, repr(time.monotonic()).encode())
            except Exception:  # disconnected: ticks stop coming back, nothing is skipped
                log.debug("interest_tick_failed")
            await asyncio.sleep(self._window / 4)

    async def _state_loop(self) -> None:
        while True:
            try:
                body = json.dumps({"node": self._node_id, "tenants": self._tenants()})
                await self._nc.publish(subjects.MESH_INTEREST_STATE, body.encode())
            except Exception:
                log.debug("interest_state_failed")
            now = time.monotonic()
            for t, nodes in list(self._remote.items()):
                for node, heard in list(nodes.items()):
                    if now - heard > 3 * STATE_EVERY_S:
                        self._forget(t, node)
            await asyncio.sleep(STATE_EVERY_S)
