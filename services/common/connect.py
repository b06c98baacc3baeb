"""What a connection node asks the session service about a CONNECT, and what it gets back.

Domain types of `SessionClient.connect`: the node fills a `ConnectAttempt` from the CONNECT
packet and its transport, and hands the `ConnectOutcome` to the channel unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.acl import AclRule
from services.common.mqtt.packets import Subscription

# A subscription with its MQTT 5 Subscription Identifier (None: the SUBSCRIBE had none).
IdentifiedSubscription = tuple[Subscription, int | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectAttempt:
    client_id: str
    username: str
    password: bytes | None
    node_id: str
    peer_address: str
    protocol_level: int
    clean_start: bool
    session_expiry_s: int  # as asked (see `requested_session_expiry`)
    cert_common_name: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectOutcome:
    """reason_code 0: accepted; otherwise the MQTT 5 CONNACK reason code of the refusal."""

    reason_code: int = 0
    tenant: str = "default"
    epoch: int = 0  # registry epoch of this connection; a later one takes the session over
    taken_over: bool = False  # a newer connection already won the race for this client id
    session_present: bool = False
    acl: tuple[AclRule, ...] = ()
    acl_default_allow: bool = True
    incarnation: int = 0
    session_expiry_s: int = 0  # what the server uses; > 0: the session outlives the connection
    subscriptions: tuple[IdentifiedSubscription, ...] = ()  # of a resumed session

    @property
    def ok(self) -> bool:
        return self.reason_code == 0


def requested_session_expiry(protocol_level: int, clean_start: bool, property_s: int | None) -> int:
    """Session Expiry Interval a CONNECT asks for: the MQTT 5 property (absent: 0), or for
    3.1/3.1.1 "never" (0xFFFFFFFF) with clean session 0 and 0 with clean session 1."""
    if protocol_level == 5:
        return property_s or 0
    return 0 if clean_start else 0xFFFFFFFF
