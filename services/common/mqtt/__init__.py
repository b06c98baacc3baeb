"""Sans-I/O MQTT 3.1 / 3.1.1 / 5.0 codec: packets, properties, reason codes, decoder, encoder.

Call `Decoder.feed(bytes)` for packets and `encode(packet, level)` for bytes. Nothing here
does I/O or reads the clock.
"""

from services.common.mqtt.body_decoder import UNLIMITED, DecodeLimits
from services.common.mqtt.decoder import DEFAULT_MAX_PACKET_SIZE, Decoder
from services.common.mqtt.encoder import encode, encode_publish, frame_publish
from services.common.mqtt.errors import (
    MalformedPacketError,
    MqttError,
    PacketTooLargeError,
    ProtocolViolationError,
    QuotaExceededError,
    TopicFilterInvalidError,
    TopicNameInvalidError,
    UnsupportedProtocolVersionError,
)
from services.common.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from services.common.mqtt.properties import EMPTY, Properties
from services.common.mqtt.reason import PacketType, ProtocolLevel, QoS, ReasonCode

__all__ = [
    "DEFAULT_MAX_PACKET_SIZE",
    "EMPTY",
    "UNLIMITED",
    "Auth",
    "ConnAck",
    "Connect",
    "DecodeLimits",
    "Decoder",
    "Disconnect",
    "MalformedPacketError",
    "MqttError",
    "Packet",
    "PacketTooLargeError",
    "PacketType",
    "PingReq",
    "PingResp",
    "Properties",
    "ProtocolLevel",
    "ProtocolViolationError",
    "PubAck",
    "PubComp",
    "PubRec",
    "PubRel",
    "Publish",
    "QoS",
    "QuotaExceededError",
    "ReasonCode",
    "SubAck",
    "Subscribe",
    "Subscription",
    "TopicFilterInvalidError",
    "TopicNameInvalidError",
    "UnsubAck",
    "Unsubscribe",
    "UnsupportedProtocolVersionError",
    "Will",
    "encode",
    "encode_publish",
    "frame_publish",
]
