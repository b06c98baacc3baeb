"""Reason Strings: whether a refusal may carry one, its text, and the reply that carries it.

MQTT 5 lets the server explain a refusal in a Reason String. Three things decide whether it
goes out: the node's `ChannelConfig.reason_strings`, the client's Request Problem Information
(0: only CONNACK and DISCONNECT may carry one [MQTT-3.1.2-29]), and the client's Maximum
Packet Size (a reply that would exceed it goes without the string [MQTT-3.1.2-25]).
MQTT 3.1/3.1.1 have no Reason Strings.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from services.common.mqtt.encoder import encode
from services.common.mqtt.packets import (
    ConnAck,
    Connect,
    Disconnect,
    PubAck,
    PubComp,
    PubRec,
    PubRel,
    SubAck,
    UnsubAck,
)
from services.common.mqtt.reason import ReasonCode as RC

Reply = TypeVar("Reply", ConnAck, Disconnect, PubAck, PubRec, PubRel, PubComp, SubAck, UnsubAck)


def describe(code: int) -> str:
    """The generic text of a reason code, e.g. 0x87 -> "not authorized"."""
    try:
        return RC(code).name.lower().replace("_", " ")
    except ValueError:
        return f"reason code 0x{code:02x}"


class Problems:
    """One connection's Reason String policy. `begin` once the CONNECT is read."""

    __slots__ = ("_enabled", "_requested", "level", "max_size")

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._requested = True  # Request Problem Information defaults to 1
        self.level = 4
        self.max_size = 1 << 28  # the client's Maximum Packet Size (none: the protocol's)

    def begin(self, p: Connect) -> None:
        """What the CONNECT says about this client."""
        self.level = p.protocol_level
        if self.level == 5:
            self._requested = p.properties.request_problem_information != 0
            self.max_size = p.properties.maximum_packet_size or self.max_size

    def encode(self, packet: Reply, text: str, always: bool = False) -> bytes:
        """`packet` encoded for the client, with `text` as its Reason String if allowed.
        `always`: a CONNACK or DISCONNECT, which may carry one even when the client set
        Request Problem Information to 0."""
        level = self.level
        if not (text and level == 5 and self._enabled and (always or self._requested)):
            return encode(packet, level)
        explained = replace(packet, properties=replace(packet.properties, reason_string=text))
        data = encode(explained, level)
        if len(data) > self.max_size:
            return encode(packet, level)  # rather no explanation than a packet it refuses
        return data
