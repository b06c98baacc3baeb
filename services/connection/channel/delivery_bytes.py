"""What a delivery to one client is in bytes: the MQTT 5 PUBLISH framed for that client (its
topic alias, the expiry left, its subscription identifiers) and what a queued delivery holds
in memory. Pure functions over values; the state they read (the client's aliases) is
outbound.py's `Outbound`, which alone changes it."""

from __future__ import annotations

import math
from dataclasses import replace

from services.common.message import Message
from services.common.mqtt.encoder import encode_properties, frame_publish
from services.common.mqtt.properties import EMPTY


def frame_v5(
    msg: Message,
    first: int,
    pid: int,
    sub_ids: tuple[int, ...],
    now: float,
    aliases: dict[str, int],
    alias_max: int,
) -> tuple[bytes, int]:
    """The MQTT 5 PUBLISH of `msg` (fixed header byte `first`, packet id `pid`) and the topic
    alias it establishes (0: none; the caller records it once the packet is written).
    `aliases`: topic -> alias the client knows; at most `alias_max` of them."""
    topic = msg.topic
    props = msg.properties
    alias = new_alias = 0
    if alias_max:
        alias = aliases.get(topic, 0)
        if alias:
            topic = ""  # the client knows the alias: the topic may be empty
        elif len(aliases) < alias_max:
            alias = new_alias = len(aliases) + 1
    if msg.expires_at is not None or sub_ids or alias:
        props = replace(
            props,
            # [MQTT-3.3.2-6] the expiry left, not the one the publisher set
            message_expiry_interval=(
                max(1, math.ceil(msg.expires_at - now))
                if msg.expires_at is not None
                else props.message_expiry_interval
            ),
            subscription_identifier=sub_ids,
            topic_alias=alias or None,
        )
    data = frame_publish(first, topic.encode(), pid, encode_properties(props), msg.payload)
    return data, new_alias


def queued_size(msg: Message) -> int:
    """What a queued message holds in memory, near enough: payload, topic and properties
    (user properties can be far larger than the payload). Only computed for messages that
    wait, never on the direct path."""
    size = len(msg.payload) + len(msg.topic.encode())
    props = msg.properties
    if props is not EMPTY:
        size += len(encode_properties(props))
    return size
