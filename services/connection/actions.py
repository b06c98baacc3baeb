"""What a channel asks its shell to do (it never does I/O itself), and the message record that
travels through a node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from services.common.acl import AclRule
from services.common.mqtt.packets import Connect, Subscription
from services.common.mqtt.properties import EMPTY, Properties


class Message(NamedTuple):
    """An application message inside a node (from a client, or from the mesh).

    A NamedTuple rather than a frozen dataclass: it is built once per message per hop and a
    tuple is about four times cheaper to construct (0.3 vs 1.2 us, measured), while staying
    immutable and typed.
    """

    tenant: str
    topic: str
    payload: bytes
    qos: int
    retain: bool
    publisher: str = ""
    properties: Properties = EMPTY  # MQTT 5 message properties (no alias, no sub ids)
    expires_at: float | None = None  # wall clock seconds
    published_at: float = 0.0
    trace_context: tuple[tuple[str, str], ...] = ()
    packet_id: int = 0  # the publisher's packet id while its PUBACK/PUBREC is deferred


@dataclass(frozen=True, slots=True)
class Authenticate:
    """Ask the session service; answer with `Channel.on_authenticated`."""

    connect: Connect
    client_id: str


@dataclass(frozen=True, slots=True)
class SubscribeRequest:
    """Add these subscriptions to the node; answer with `Channel.on_subscribed`."""

    packet_id: int
    subscriptions: tuple[tuple[Subscription, int | None], ...]  # (options, subscription id)
    reason_codes: tuple[int, ...]  # final codes, slots of refused filters already filled
    fresh: tuple[bool, ...] = ()  # per subscription: it did not exist before (retain handling 1)


@dataclass(frozen=True, slots=True)
class Unsubscribed:
    filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Close:
    """Close the transport after writing what is in `out`."""

    reason_code: int
    reason: str


@dataclass(frozen=True, slots=True)
class AuthResult:
    ok: bool
    reason_code: int = 0
    tenant: str = "default"
    epoch: int = 0
    session_present: bool = False
    acl: tuple[AclRule, ...] = ()
    acl_default_allow: bool = True
    incarnation: int = 0
    session_expiry_s: int = 0  # what the server uses; > 0: the session outlives the connection
    subscriptions: tuple[tuple[Subscription, int | None], ...] = ()  # of a resumed session


Action = Authenticate | SubscribeRequest | Unsubscribed | Close


_MSG_PROPS = (
    "payload_format_indicator",
    "content_type",
    "response_topic",
    "correlation_data",
    "user_property",
)


def message_properties(props: Properties) -> Properties:
    """Keep only what travels with the message (no alias, no expiry: that is `expires_at`)."""
    if (
        props.payload_format_indicator is None
        and props.content_type is None
        and props.response_topic is None
        and props.correlation_data is None
        and not props.user_property
    ):
        return EMPTY
    return Properties(**{k: getattr(props, k) for k in _MSG_PROPS})
