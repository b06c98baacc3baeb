"""MQTT 5 enhanced authentication (AUTH packets) on the session side: SCRAM-SHA-256/512
against the user's stored verifiers, one step per call, for CONNECT and re-authentication.

The connection node carries the exchange: it sends each client message here with the opaque
state the previous step returned, and relays our answer (AUTH 0x18 to go on, CONNACK or AUTH
0x00 with the server-final-message when done). Nothing is kept here between steps, so any
session-service instance can take the next one. A user that does not exist gets a decoy
verifier: the exchange runs to the proof and fails there, like a wrong password.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from services.common.mqtt.reason import ReasonCode as RC
from services.session import scram
from services.session.auth import Authenticator as Users
from services.session.auth import split_username
from services.session.scram import MECHANISMS, ScramError, Verifier

CONTINUE = RC.CONTINUE_AUTHENTICATION


@dataclass(frozen=True, slots=True)
class Step:
    """code 0: authenticated (send `data` as the server-final-message); CONTINUE: send
    `data` in AUTH 0x18 and keep `state`; anything else: refuse with that reason code."""

    code: int
    data: bytes = b""
    state: bytes = b""
    tenant: str = ""
    name: str = ""
    reason: str = ""

    @property
    def failed(self) -> bool:
        return self.code not in (0, CONTINUE)


def supported(method: str) -> bool:
    return method in MECHANISMS


class EnhancedAuth:
    def __init__(self, users: Users) -> None:
        self._users = users
        self._decoy_secret = secrets.token_bytes(32)

    async def step(self, username: str, method: str, data: bytes, state: bytes) -> Step:
        """One step. `username`: the CONNECT user name (or, on re-authentication, the
        identity the connection has); when empty, the SCRAM user name decides."""
        if not supported(method):
            return Step(RC.BAD_AUTHENTICATION_METHOD, reason=f"unsupported method {method!r}")
        tenant = name = ""
        try:
            if not state:
                client = scram.parse_client_first(data)
                tenant, name = split_username(username or client.username)
                verifier = await self._verifier(tenant, name, method)
                server_first, new_state = scram.first(method, client, verifier)
                return Step(CONTINUE, server_first, new_state, tenant, name)
            exchange = scram.read_state(state)
            if exchange.mechanism != method:
                raise ScramError("authentication method changed")
            tenant, name = split_username(username or exchange.username)
            verifier = await self._verifier(tenant, name, method)
            server_final = scram.final(data, exchange, verifier)
        except (ScramError, ValueError, KeyError) as exc:
            return Step(RC.NOT_AUTHORIZED, tenant=tenant, name=name, reason=str(exc))
        return Step(0, server_final, b"", tenant, name)

    async def _verifier(self, tenant: str, name: str, method: str) -> Verifier:
        creds = await self._users.credentials(tenant, name)
        verifier = creds.scram.get(method) if creds is not None else None
        if verifier is None:
            verifier = scram.decoy_verifier(method, f"{tenant}/{name}", self._decoy_secret)
        return verifier
