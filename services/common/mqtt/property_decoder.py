"""Decoding of an MQTT 5 property block (spec 2.2.2): `decode_properties`, and the count
limits (`DecodeLimits`) that bound the work one packet costs.

Every property's identifier, kind and the packets it may appear in come from
properties.PROPERTY_SPECS; a value is read by its kind, then checked (booleans, non-zero
values, a Response Topic without wildcards, repeats).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.common.mqtt.errors import (
    MalformedPacketError,
    ProtocolViolationError,
    QuotaExceededError,
)
from services.common.mqtt.primitives import (
    read_binary,
    read_str,
    read_u8,
    read_u16,
    read_u32,
    read_varint,
)
from services.common.mqtt.properties import (
    BOOLEAN_BYTES,
    EMPTY,
    NONZERO,
    PROPERTY_SPECS,
    REPEATABLE,
    Properties,
    PropId,
    PropKind,
)
from services.common.mqtt.reason import PacketType, ReasonCode

# A zero where the property forbids one is a Protocol Error (0x82), except a Topic Alias of 0:
# Topic Alias invalid, as one above the maximum [MQTT-3.3.2-8] (section 3.3.2.3.4).
_ZERO_REASON: dict[int, ReasonCode] = {PropId.TOPIC_ALIAS: ReasonCode.TOPIC_ALIAS_INVALID}

# No count limit: what the packet size allows (every repeated field takes at least a byte).
_NO_LIMIT = 268_435_455


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Count limits checked while a body is read, so the work one packet costs stays bounded
    however small its fields are (a packet of a maximal size made of 5-byte user properties
    would otherwise be hundreds of thousands of Python objects)."""

    # Per property block: user properties, and subscription identifiers (counted apart).
    max_user_properties: int = _NO_LIMIT
    # Per SUBSCRIBE / UNSUBSCRIBE.
    max_topic_filters: int = _NO_LIMIT


# Bounded only by the packet size: for clients, tools and tests decoding a server's packets.
UNLIMITED = DecodeLimits()


def _read_pair(b: bytes, i: int, end: int) -> tuple[tuple[str, str], int]:
    k, i = read_str(b, i, end)
    v, i = read_str(b, i, end)
    return (k, v), i


# How a property's value is read, by its kind.
_READERS: dict[PropKind, Callable[[bytes, int, int], tuple[Any, int]]] = {
    PropKind.BYTE: read_u8,
    PropKind.U16: read_u16,
    PropKind.U32: read_u32,
    PropKind.VARINT: read_varint,
    PropKind.UTF8: read_str,
    PropKind.BINARY: read_binary,
    PropKind.PAIR: _read_pair,
}


def decode_properties(
    b: bytes, i: int, end: int, where: int, limits: DecodeLimits = UNLIMITED
) -> tuple[Properties, int]:
    """Read a property block for packet type `where` (or WILL); enforce spec 2.2.2 rules.

    Linear in the block's size: the repeatable properties grow lists, turned into tuples once
    at the end (growing a tuple per value would copy it each time: quadratic, seconds of event
    loop for one packet of tens of thousands of user properties). Each repeatable property
    may appear at most `limits.max_user_properties` times (QuotaExceededError, 0x97)."""
    length, i = read_varint(b, i, end)
    if length == 0:
        return EMPTY, i
    stop = i + length
    if stop > end:
        raise MalformedPacketError("property length runs past the packet end")
    values: dict[str, Any] = {}
    repeated: dict[str, list[Any]] = {}
    max_repeats = limits.max_user_properties
    while i < stop:
        ident, i = read_varint(b, i, stop)
        spec = PROPERTY_SPECS.get(ident)
        if spec is None:
            raise MalformedPacketError(f"unknown property identifier 0x{ident:02x}")
        if where not in spec.allowed_in:
            raise MalformedPacketError(f"property {spec.name} is not allowed in this packet")
        value, i = _READERS[spec.kind](b, i, stop)
        if ident in BOOLEAN_BYTES and value > 1:
            raise ProtocolViolationError(f"property {spec.name} must be 0 or 1")
        if ident == PropId.RESPONSE_TOPIC and ("+" in value or "#" in value):
            # [MQTT-3.3.2-14]: a responder would publish to a filter, not a topic.
            raise ProtocolViolationError("response topic contains a wildcard")
        if ident in NONZERO and value == 0:
            raise ProtocolViolationError(f"{spec.name} must not be 0", _ZERO_REASON.get(ident))
        if ident in REPEATABLE:
            seen = repeated.get(spec.name)
            if seen is None:
                repeated[spec.name] = [value]
            else:
                _check_repeat(ident, spec.name, where, len(seen), max_repeats)
                seen.append(value)
        elif spec.name in values:
            # [MQTT-2.2.2-2] a property other than the repeatable ones appears at most once.
            raise ProtocolViolationError(f"property {spec.name} included more than once")
        else:
            values[spec.name] = value
    if i != stop:
        raise MalformedPacketError("property block length mismatch")
    for name, seq in repeated.items():
        values[name] = tuple(seq)
    return Properties(**values), i


def _check_repeat(ident: int, name: str, where: int, seen: int, max_repeats: int) -> None:
    """A repeatable property seen `seen` times already comes again: a protocol error for a
    second Subscription Identifier in a SUBSCRIBE, over the count limit past `max_repeats`."""
    if ident == PropId.SUBSCRIPTION_IDENTIFIER and where == PacketType.SUBSCRIBE:
        # [MQTT-3.8.2.1.2] at most one Subscription Identifier in a SUBSCRIBE.
        raise ProtocolViolationError("subscription identifier included more than once")
    if seen >= max_repeats:
        raise QuotaExceededError(
            f"more than {max_repeats} {name} properties", limit="max_user_properties"
        )
