"""The gateway SIGKILLed while HTTP clients publish at QoS 1: every publish answered 200
arrives at a persistent subscriber (a 200 means kept, as a PUBACK does); the publishes cut
off by the kill got no answer and may or may not arrive. The gateway is started again on
the same ports afterwards (the shared mesh's other tests use it)."""

from __future__ import annotations

import asyncio
import itertools
import threading

import aiohttp

from tests.conftest import MeshInfo
from tests.e2e.clients import Paho
from tests.gateway.helpers import add_user, bearer, tenant_token
from tests.poll import wait_until

PUBLISHERS = 8
BEFORE_KILL = 60  # publishes answered 200 before the kill
AFTER_RESTART = 40  # and after the restart


def test_kill_while_publishing_loses_nothing_acknowledged(mesh: MeshInfo) -> None:
    """Sync (the launcher restarts the gateway from this thread, which outlives it); the
    publishers run in a thread of their own with an event loop."""
    asyncio.run(add_user(mesh, "acme", "gw-kill-sub", "pw"))
    token = asyncio.run(tenant_token(mesh, "acme"))
    sub = Paho(mesh.node(1), client_id="gw-kill-sub", username="acme/gw-kill-sub", password="pw")
    sub.connect(clean_start=False, session_expiry=300)
    sub.subscribe("gw/kill/#", 1)
    acked: set[str] = set()
    stop = threading.Event()
    publishing = threading.Thread(
        target=lambda: asyncio.run(_publish(mesh.gateway_http, token, acked, stop)), daemon=True
    )
    publishing.start()
    try:
        wait_until(lambda: len(acked) >= BEFORE_KILL, 30, "publishes before the kill")
        mesh.launcher.kill("gateway")  # SIGKILL, with requests in flight
        killed_at = len(acked)
        mesh.launcher.restart("gateway")
        wait_until(lambda: len(acked) >= killed_at + AFTER_RESTART, 30, "publishes after restart")
    finally:
        stop.set()
        publishing.join(30)
    received: set[str] = set()

    def arrived() -> bool:
        while not sub.messages.empty():
            received.add(sub.messages.get_nowait().payload.decode())
        return acked <= received

    try:
        wait_until(arrived, 30, lambda: f"{len(acked - received)} acknowledged, missing")
    finally:
        sub.close(session_expiry=0)
    assert len(acked) >= BEFORE_KILL + AFTER_RESTART


async def _publish(base: str, token: str, acked: set[str], stop: threading.Event) -> None:
    """PUBLISHERS clients publishing QoS 1 until `stop`; each payload answered 200 goes in
    `acked` (connection errors while the gateway is down are tried again)."""
    counter = itertools.count()

    async def publisher(http: aiohttp.ClientSession, n: int) -> None:
        while not stop.is_set():
            payload = f"{n}-{next(counter)}"
            body = {"topic": f"gw/kill/{n}", "payload": payload, "qos": 1}
            try:
                async with http.post("/api/v5/publish", json=body, headers=bearer(token)) as r:
                    if r.status == 200:
                        acked.add(payload)
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(0.05)

    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(base, timeout=timeout) as http:
        await asyncio.gather(*(publisher(http, n) for n in range(PUBLISHERS)))
