"""MeshPresence: the gateway's part in the nodes' mesh interest (services/connection/
interest.py): a node skips putting a tenant's messages on NATS while no other process
announced interest in that tenant, so the gateway announces the tenants its CoAP observers
read, as a node announces its subscribers' tenants.

What it does, on the same subjects and payloads as a node: `hold(tenant)` for a tenant new
here publishes `mi.add` with a reply inbox and returns once every node heard within the
last SILENT_S answered (or after `wait_s`, the nodes' window plus 10%); the whole set goes
on `mi.state` every STATE_EVERY_S (a tenant stays announced STICKY_S after its last
observer); and it answers every other process's `mi.add` from the same subscription, as
nodes expect of everyone they heard from. It never skips a publish itself (the gateway's
publishes always go on NATS), so it sends no ticks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus import subjects

log = logging.getLogger("starling.gateway.interest")

STATE_EVERY_S = 2.0  # as the nodes' (services/connection/interest.py)
STICKY_S = 300.0
SILENT_S = 3 * STATE_EVERY_S


class MeshPresence:
    def __init__(self, *, nc: Client, node_id: str, wait_s: float) -> None:
        self._nc = nc
        self._node_id = node_id
        self._wait_s = wait_s
        self._held: dict[str, int] = {}  # tenant -> observers
        self._idle_since: dict[str, float] = {}
        self._nodes: dict[str, float] = {}  # other processes -> last heard
        self._announcing: dict[str, asyncio.Future[None]] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._nc.subscribe(subjects.MESH_INTEREST_ALL, cb=self._on_message)
        self._task = asyncio.create_task(self._state_loop(), name="gateway-interest")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def hold(self, tenant: str) -> None:
        """An observer of `tenant` starts: returns once the nodes publish its messages."""
        count = self._held.get(tenant, 0)
        self._held[tenant] = count + 1
        idle = self._idle_since.pop(tenant, None)
        if count or (idle is not None and time.monotonic() - idle < STICKY_S):
            pending = self._announcing.get(tenant)
        else:
            pending = asyncio.ensure_future(self._announce(tenant))
            self._announcing[tenant] = pending
            pending.add_done_callback(lambda _: self._announcing.pop(tenant, None))
        if pending is not None:
            await asyncio.shield(pending)

    def release(self, tenant: str) -> None:
        count = self._held.get(tenant, 0) - 1
        if count > 0:
            self._held[tenant] = count
            return
        self._held.pop(tenant, None)
        self._idle_since[tenant] = time.monotonic()

    def _tenants(self) -> list[str]:
        now = time.monotonic()
        for t in [t for t, since in self._idle_since.items() if now - since >= STICKY_S]:
            del self._idle_since[t]
        return sorted({*self._held, *self._idle_since})

    async def _announce(self, tenant: str) -> None:
        now = time.monotonic()
        expected = {n for n, heard in self._nodes.items() if now - heard < SILENT_S}
        answered: set[str] = set()
        everyone = asyncio.Event()

        async def on_answer(msg: Msg) -> None:
            answered.add(msg.data.decode(errors="replace"))
            if expected and answered >= expected:
                everyone.set()

        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox, cb=on_answer)
        try:
            body = json.dumps({"node": self._node_id, "tenants": [tenant]}).encode()
            await self._nc.publish(subjects.MESH_INTEREST_ADD, body, reply=inbox)
            await self._nc.flush(5)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(everyone.wait(), self._wait_s)
        finally:
            await sub.unsubscribe()

    async def _on_message(self, msg: Msg) -> None:
        if msg.subject.startswith(subjects.MESH_INTEREST_TICK_PREFIX):
            return
        try:
            node = str(json.loads(msg.data)["node"])
        except (ValueError, KeyError, TypeError):
            return
        if node == self._node_id:
            return
        self._nodes[node] = time.monotonic()
        if msg.reply:
            await self._nc.publish(msg.reply, self._node_id.encode())

    async def _state_loop(self) -> None:
        while True:
            body = json.dumps({"node": self._node_id, "tenants": self._tenants()})
            try:
                await self._nc.publish(subjects.MESH_INTEREST_STATE, body.encode())
            except Exception:
                log.debug("interest_publish_failed")
            now = time.monotonic()
            for n in [n for n, heard in self._nodes.items() if now - heard > SILENT_S]:
                del self._nodes[n]
            await asyncio.sleep(STATE_EVERY_S)
