"""The application message as services hold it in memory (from a client, the mesh or a queue).

On the wire between processes it travels as `RoutedMessage` (services/common/envelope.py
converts); inside a process every service uses this one type.
"""

from __future__ import annotations

from typing import NamedTuple

from services.common.mqtt.properties import EMPTY, Properties


class Message(NamedTuple):
    """An application message.

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
    # The id it is routed under when fixed before routing: a persistent session's QoS 2
    # publish, recorded with the session first ("": the node assigns one).
    message_id: str = ""


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
