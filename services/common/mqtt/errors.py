"""The codec's error tree: every error *is* an MQTT reason code.

The connection layer answers an `MqttError` with DISCONNECT(reason_code) on MQTT 5 and a plain
close on 3.1/3.1.1. Nothing else escapes the decoder.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.common.mqtt.reason import ReasonCode


class MqttError(Exception):
    """Base of every codec/protocol error; `reason_code` is what the peer is told."""

    reason_code: ReasonCode = ReasonCode.UNSPECIFIED_ERROR

    def __init__(
        self, message: str, reason_code: ReasonCode | None = None, limit: str = ""
    ) -> None:
        super().__init__(message)
        if reason_code is not None:
            self.reason_code = reason_code
        # Not empty: the configured limit the peer exceeded (counted in the node's metrics).
        self.limit = limit
        # Packets decoded before the error in the same feed (see decoder.Decoder.feed).
        self.packets: Sequence[object] = ()
        self.cause: BaseException | None = None


class MalformedPacketError(MqttError):
    reason_code = ReasonCode.MALFORMED_PACKET


class ProtocolViolationError(MqttError):
    reason_code = ReasonCode.PROTOCOL_ERROR


class PacketTooLargeError(MqttError):
    reason_code = ReasonCode.PACKET_TOO_LARGE


class QuotaExceededError(MqttError):
    """A packet breaks a count limit we impose (user properties, filters per packet)."""

    reason_code = ReasonCode.QUOTA_EXCEEDED


class UnsupportedProtocolVersionError(MqttError):
    reason_code = ReasonCode.UNSUPPORTED_PROTOCOL_VERSION


class TopicNameInvalidError(MqttError):
    reason_code = ReasonCode.TOPIC_NAME_INVALID


class TopicFilterInvalidError(MqttError):
    reason_code = ReasonCode.TOPIC_FILTER_INVALID
