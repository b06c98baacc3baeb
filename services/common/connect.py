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
    cert_common_name: str = ""  # of a client certificate the TLS handshake verified
    cert_subject_alt_names: tuple[str, ...] = ()  # "DNS:x", "email:y", "URI:z", "IP:a"
    # MQTT 5 enhanced authentication: the method, this step's client data, and the state
    # the previous step's outcome carried (empty on the first step).
    auth_method: str = ""
    auth_data: bytes = b""
    auth_state: bytes = b""
    # The will as a serialized RoutedMessage envelope (b"": none) and its Will Delay
    # Interval: kept with the connection's registry entry so that the session service
    # publishes it if the node dies.
    will: bytes = b""
    will_delay_s: int = 0


# Wills handed to the session service with the CONNECT, kept in the registry and published by
# the session service if their node dies (services/session/wills.py): the default bound of
# their envelope (`will_store_max_bytes`, on nodes and session services alike) and its upper
# limit (well under a NATS message, so a batch of CONNECTs still fits a few).
WILL_STORE_MAX_BYTES = 64 << 10
WILL_STORE_LIMIT_BYTES = 512 << 10


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
    # Enhanced authentication: `auth_continue` -> send AUTH 0x18 with `auth_data` and hand
    # `auth_state` back with the client's answer; accepted -> `auth_data` goes in the CONNACK.
    auth_continue: bool = False
    auth_data: bytes | None = None
    auth_state: bytes = b""
    identity: str = ""  # `tenant/name` the connection authenticated as
    # QoS 2 publishes of a resumed session awaiting PUBREL: (packet id, message id, stored).
    awaiting_release: tuple[tuple[int, str, bool], ...] = ()
    # A delayed will of an earlier connection may be pending (the client id had a session):
    # the node asks the router to cancel it (session resumed) or publish it now.
    settle_will: bool = True
    # The persistent session's QoS 2 fence as this connection set it: stamped on its QoS 2
    # receiver-state changes, so that what an earlier connection still writes is ignored.
    qos2_fence: int = 0
    # A refusal's Reason String for MQTT 5 clients (empty: the reason code's description).
    reason_string: str = ""

    @property
    def ok(self) -> bool:
        return self.reason_code == 0 and not self.auth_continue


@dataclass(frozen=True, slots=True, kw_only=True)
class ReauthAttempt:
    """One step of re-authentication (AUTH 0x19, then 0x18s) on a live connection."""

    tenant: str
    identity: str  # ConnectOutcome.identity: the same user must be proven again
    client_id: str
    peer_address: str
    auth_method: str
    auth_data: bytes
    auth_state: bytes = b""


def requested_session_expiry(protocol_level: int, clean_start: bool, property_s: int | None) -> int:
    """Session Expiry Interval a CONNECT asks for: the MQTT 5 property (absent: 0), or for
    3.1/3.1.1 "never" (0xFFFFFFFF) with clean session 0 and 0 with clean session 1."""
    if protocol_level == 5:
        return property_s or 0
    return 0 if clean_start else 0xFFFFFFFF
