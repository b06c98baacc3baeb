"""What a channel asks its shell to do: it never does I/O itself, it returns these.

Bytes to write are not actions: they accumulate in `Channel.out` and the shell flushes them.
Every call that can produce actions returns them in a fresh `list[Action]` the caller owns (it
may append to it); the list is in packet order, except `DeliveryProgress`, which follows
the other actions of the call but precedes a `Close` (always last).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.connect import IdentifiedSubscription
from services.common.message import Message
from services.common.mqtt.packets import Connect


@dataclass(frozen=True, slots=True)
class Route:
    """Publishes from the client, in the order they came: hand them to the mesh.

    Consecutive PUBLISH packets share one Route; `messages` is filled while the channel
    handles them, so it is complete only once the call that returned it is over."""

    messages: list[Message]


@dataclass(frozen=True, slots=True)
class Authenticate:
    """Ask the session service about this CONNECT; answer with `Channel.authenticated`."""

    connect: Connect
    client_id: str  # the client's, or the one the channel assigned [MQTT-3.1.3-6]
    # Enhanced authentication (the CONNECT named a method): this step's data from the
    # client, and the state the previous step's outcome carried (empty on the first).
    auth_data: bytes | None = None
    auth_state: bytes = b""


@dataclass(frozen=True, slots=True)
class Reauthenticate:
    """A step of re-authentication on a live connection: ask the session service, answer
    with `Channel.reauthenticated`."""

    method: str
    data: bytes
    state: bytes  # empty on the first step (AUTH 0x19)
    identity: str  # `tenant/name` the connection authenticated as


@dataclass(frozen=True, slots=True)
class SubscribeRequest:
    """Add these subscriptions to the node; answer with `Channel.subscribed`."""

    packet_id: int
    subscriptions: tuple[IdentifiedSubscription, ...]  # the accepted ones
    reason_codes: tuple[int, ...]  # final codes, slots of refused filters already filled
    fresh: tuple[bool, ...] = ()  # per subscription: it did not exist before (retain handling 1)
    # New filters counted against the client's subscription limit until the SUBACK; the
    # answer passed to `Channel.subscribed` must carry the same number.
    reserved: int = 0


@dataclass(frozen=True, slots=True)
class AutoSubscribe:
    """The tenant's auto-subscriptions this client takes, already recorded as its own: put
    them in place (node, mesh, a persistent session's stored subscriptions), then answer with
    `Channel.auto_subscribed`. The CONNACK waits for that answer."""

    request: SubscribeRequest


@dataclass(frozen=True, slots=True)
class Unsubscribed:
    """The client removed these filters (the UNSUBACK is already written)."""

    filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Close:
    """Close the transport after writing what is in `out`."""

    reason_code: int
    reason: str


@dataclass(frozen=True, slots=True)
class ReleaseQos2:
    """PUBREL of a persistent session's QoS 2 publish: forget it in the session's stored
    receiver state, durably, then call `Channel.qos2_released` (which writes PUBCOMP)."""

    packet_id: int


@dataclass(frozen=True, slots=True)
class DeliveryProgress:
    """The client acknowledged deliveries of a persistent session: `outbound.take_progress()`
    hands over new packet ids for its queue (only after `outbound.track_completions()`). At
    most one per call."""


Action = (
    Route
    | Authenticate
    | Reauthenticate
    | SubscribeRequest
    | AutoSubscribe
    | Unsubscribed
    | Close
    | DeliveryProgress
    | ReleaseQos2
)
