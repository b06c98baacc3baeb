"""Takeover fencing across a lost registry: notice that Redis lost the registry, ask every node
to re-assert its connections, and settle each re-asserted one (re-installed, or kicked because
a later connection took the client id meanwhile).

Why re-assertion rather than a fence in the durable store: the registry's epochs are
time-ordered (services/session/registry.py), so a CONNECT after the loss still outranks every
connection from before it; what the loss takes away is knowing *where* those connections are.
The nodes know, so they tell. This keeps every CONNECT on Redis alone (no store write, no
Cassandra LWT per CONNECT) and rebuilds the whole registry (connection caps, ListClients,
which node holds which client for node liveness), not just the fence.
"""

from __future__ import annotations

import asyncio
import base64
import logging

from nats.aio.client import Client

from services.common.bus import subjects
from services.common.bus.flushing import flushed
from services.common.clock import now_ms
from services.session.failover import PrimaryWatch
from services.session.registry import Holder, Registry
from starling.session.v1 import session_pb2 as pb

log = logging.getLogger("starling.session.fence")


async def announce_loss(nc: Client, generation: str) -> None:
    """Ask every connection node to re-assert what it holds."""
    log.warning("registry_lost", extra={"generation": generation})
    await nc.publish(subjects.REGISTRY_LOST, generation.encode())
    await flushed(nc, 2)


async def watch_generation(
    registry: Registry, nc: Client, period_s: float = 1.0, primary: PrimaryWatch | None = None
) -> None:
    """Check the registry's sentinel every `period_s`, and with `primary` whether another
    server became the primary (a failover to a replica that lagged: services/session/
    failover.py): a loss is noticed within a period even when no CONNECT arrives to notice it."""
    while True:
        try:
            generation = await registry.check_generation()
            moved = await primary.check() if primary is not None else None
            if generation is not None or moved is not None:
                await announce_loss(nc, generation or moved or "")
        except Exception:  # Redis down for now: try again next period
            log.warning("registry_generation_check_failed", exc_info=True)
        await asyncio.sleep(period_s)


def reclaimed_holder(node_id: str, c: pb.HeldConnection, will_max_bytes: int = 0) -> Holder:
    """The registry entry of a re-asserted connection. Its owner is unknown to the node
    (None): client id ownership falls back to the session's owner in the store; a node that
    does not know when it accepted the connection gets the time of re-assertion. Its will is
    kept as at CONNECT (the node checked the topic against the connection's ACL), if it fits
    `will_max_bytes`."""
    keep = bool(c.will) and len(c.will) <= will_max_bytes
    return Holder(
        tenant=c.tenant,
        client_id=c.client_id,
        node_id=node_id,
        epoch=c.epoch,
        username=c.username,
        peer_address=c.peer_address,
        protocol_level=c.protocol_level,
        connected_at_ms=c.connected_at_ms or now_ms(),
        clean_start=c.clean_start,
        owner=None,
        will=base64.b64encode(c.will).decode() if keep else "",
        will_delay_s=c.will_delay_s if keep else 0,
    )
