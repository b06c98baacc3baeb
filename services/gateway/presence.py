"""Presence: the gateway as the session service sees a connection node. Its clients (CoAP
clients, and each Basic-auth HTTP login while it is checked) are opened and released in the
session registry under the gateway's node id, so they appear in `starling clients`, in the
tenant's connection count and events, and a CONNECT elsewhere with the same client id takes
one over (`ctl.node.<id>` kicks, answered as a node answers them).

As a node does, the gateway says hello when it starts (the session service releases what an
earlier life of the same node id held: a killed gateway's CoAP clients go), re-asserts its
clients when the registry was lost (`ctl.nodes.reassert`), and publishes a heartbeat every
HEARTBEAT_S (a silent one is declared dead after the session service's
`node_timeout_s`, and its clients released). Unlike a node it does not fence itself on
unanswered heartbeats: a CoAP observation carries no session state to protect, so a
gateway cut off from the session service keeps its observers until they go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace

from nats.aio.client import Client
from nats.aio.msg import Msg

from services.common.bus import subjects
from services.common.connect import ConnectAttempt, ConnectOutcome
from services.common.mqtt.reason import ReasonCode
from services.session.client import SessionClient
from starling.connection.v1 import connection_pb2
from starling.session.v1 import session_pb2

log = logging.getLogger("starling.gateway.presence")

HEARTBEAT_S = 1.0

# (tenant, client id, epoch up to which to close; 0: any) -> whether it was held here
KickHandler = Callable[[str, str, int], bool]
Held = Callable[[], list[session_pb2.HeldConnection]]


# The HTTP-like status (CoAP maps it) of a CONNECT the session service refused.
_STATUS_OF_REFUSAL = {
    ReasonCode.BAD_USER_NAME_OR_PASSWORD: 401,
    ReasonCode.NOT_AUTHORIZED: 401,
    ReasonCode.BANNED: 403,
    ReasonCode.QUOTA_EXCEEDED: 429,
    ReasonCode.CONNECTION_RATE_EXCEEDED: 429,
}


class LoginRefusedError(Exception):
    """A login the session service refused or did not answer: `status` (401, 403, 429,
    503) and the reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def refusal_status(code: int, reason_string: str) -> tuple[int, str]:
    """The status and reason of a CONNECT refused with `code`."""
    try:
        rc = ReasonCode(code)
    except ValueError:
        return 503, reason_string or f"refused with reason code {code:#x}"
    return _STATUS_OF_REFUSAL.get(rc, 503), reason_string or rc.name.lower().replace("_", " ")


class Presence:
    def __init__(self, *, nc: Client, session: SessionClient, node_id: str) -> None:
        self._nc = nc
        self._session = session
        self.node_id = node_id
        self._beating: asyncio.Task[None] | None = None

    async def start(self, on_kick: KickHandler, held: Held) -> None:
        """Say hello, begin the heartbeats, hand every kick to `on_kick`; `held` lists the
        clients to re-assert when the session registry was lost (`ctl.nodes.reassert`)."""

        async def kicked(msg: Msg) -> None:
            await self._kicked(msg, on_kick)

        async def reassert(msg: Msg) -> None:
            await self._reassert(held())

        await self._nc.subscribe(subjects.node_control(self.node_id), cb=kicked)
        await self._nc.subscribe(subjects.REGISTRY_LOST, cb=reassert)
        await self._nc.publish(subjects.node_hello(self.node_id), self.node_id.encode())
        self._beating = asyncio.create_task(self._beat(), name="gateway-heartbeat")

    async def stop(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beating

    async def open(self, attempt: ConnectAttempt) -> ConnectOutcome:
        """Authenticate and register one client (`attempt.node_id` is set here)."""
        return await self._session.connect(replace(attempt, node_id=self.node_id))

    async def login(
        self, *, client_id: str, username: str, password: bytes | None, peer: str
    ) -> ConnectOutcome:
        """Authenticate `username` and register `client_id` as an MQTT 5 clean client of
        this gateway; LoginRefusedError when refused or unanswered."""
        attempt = ConnectAttempt(
            client_id=client_id,
            username=username,
            password=password,
            node_id=self.node_id,
            peer_address=peer,
            protocol_level=5,
            clean_start=True,
            session_expiry_s=0,
        )
        try:
            outcome = await self.open(attempt)
        except Exception as exc:
            log.warning("login_failed", extra={"error": type(exc).__name__})
            raise LoginRefusedError(503, "the session service did not answer") from None
        if outcome.reason_code:
            raise LoginRefusedError(*refusal_status(outcome.reason_code, outcome.reason_string))
        return outcome

    async def release(self, tenant: str, client_id: str, outcome: ConnectOutcome) -> None:
        """The client is gone: its registry entry is released, its session ended."""
        try:
            await self._session.disconnect(
                tenant,
                client_id,
                outcome.epoch,
                self.node_id,
                outcome.incarnation,
                0,
                outcome.qos2_fence,
            )
        except Exception as exc:  # the next hello or the node timeout releases it
            log.warning("client_release_failed", extra={"error": type(exc).__name__})

    async def _reassert(self, held: list[session_pb2.HeldConnection]) -> None:
        """The registry was lost (a Redis failover): install our clients again; those
        another connection took meanwhile are kicked here by the service."""
        if not held:
            return
        try:
            reclaimed, superseded = await self._session.reclaim(self.node_id, held)
        except Exception as exc:
            log.warning("registry_reassert_failed", extra={"error": type(exc).__name__})
            return
        log.warning("registry_reasserted", extra={"reclaimed": reclaimed, "superseded": superseded})

    async def _beat(self) -> None:
        subject = subjects.node_heartbeat(self.node_id)
        while True:
            try:
                await self._nc.publish(subject, self.node_id.encode())
            except Exception:
                log.warning("heartbeat_failed")
            await asyncio.sleep(HEARTBEAT_S)

    async def _kicked(self, msg: Msg, on_kick: KickHandler) -> None:
        try:
            kick = connection_pb2.Kick.FromString(msg.data)
        except Exception:
            log.warning("kick_malformed")
            return
        known = on_kick(kick.tenant, kick.client_id, kick.epoch)
        if msg.reply:
            reply = connection_pb2.KickReply(ended=False, unknown=not known)
            await self._nc.publish(msg.reply, reply.SerializeToString())
