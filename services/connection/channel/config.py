"""The limits and policies of every channel on a node (built once from the node's settings)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from services.common.mqtt.decoder import DEFAULT_MAX_PACKET_SIZE
from services.common.topics import DEFAULT_LIMITS, TopicLimits


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    node_id: str = "node"
    max_packet_size_bytes: int = DEFAULT_MAX_PACKET_SIZE
    # Until the CONNECT is accepted: a client nobody knows yet gets less.
    max_connect_packet_size_bytes: int = 64 << 10
    max_user_properties: int = 256  # per property block
    max_filters_per_subscribe: int = 100  # and per UNSUBSCRIBE
    max_subscriptions_per_client: int = 1000
    receive_maximum: int = 1024  # inbound QoS 2 window we announce
    topic_alias_maximum: int = 64  # inbound aliases we accept
    outbound_topic_alias_maximum: int = 64  # aliases we set up towards a client, at most
    max_keepalive_s: int = 3600  # 0: accept what the client asks
    server_keepalive_s: int = 3600  # for MQTT 5 clients asking 0; 0: let them
    connect_timeout_s: float = 5.0
    # The CONNACK waits this long at most for the auto-subscriptions (then: 0x88, retry).
    auto_subscribe_timeout_s: float = 10.0
    v3_inflight: int = 256  # outbound window for clients that cannot tell us theirs
    max_queued_messages: int = 1000
    max_queued_bytes: int = 4 << 20  # QoS 1/2 waiting for the window or the transport
    slow_consumer_timeout_s: float = 60.0  # congested that long: DISCONNECT 0x97
    max_client_id_length: int = 256
    max_held_packets: int = 1000
    # Packets of a connected client that are not PUBLISH, DISCONNECT, nor an ack of one of
    # its exchanges (PINGREQ, SUBSCRIBE, UNSUBSCRIBE, AUTH, acks of unknown ids): a token
    # bucket of this rate and burst; past it, DISCONNECT 0x96. 0: no limit.
    control_packets_per_s: float = 1000.0
    control_packets_burst: int = 2000
    # PUBACK/PUBREC of forwarded QoS 1/2 publishes wait for `Channel.publish_routed` (the node
    # acks once the router has stored the message in every matching persistent queue).
    defer_publish_acks: bool = False
    topic_limits: TopicLimits = field(default=DEFAULT_LIMITS)
    reason_strings: bool = True  # explain refusals to MQTT 5 clients (Reason String)
    # Response Information for clients that ask for it: `{client_id}` is replaced; "": none.
    response_information: str = ""
    # tenant -> (Server Reference, moved): its clients get CONNACK 0x9D (moved) or 0x9C.
    redirects: Mapping[str, tuple[str, bool]] = field(default_factory=dict)
