"""Conversion between the in-memory `Message` and the `RoutedMessage` envelope on the wire."""

from __future__ import annotations

from services.common.message import Message
from services.common.mqtt.properties import EMPTY, Properties
from starling.common.v1.message_pb2 import (
    MessageProperties,
    RoutedBatch,
    RoutedMessage,
    UserProperty,
)


def _finish(env: RoutedMessage, msg: Message, node_id: str) -> RoutedMessage:
    # The publisher set field by field: a nested dict to the constructor costs 0.2 us more.
    publisher = env.publisher
    publisher.client_id = msg.publisher
    publisher.node_id = node_id
    return _extras(env, msg)


def _extras(env: RoutedMessage, msg: Message) -> RoutedMessage:
    """The message's properties and trace context, if any."""
    p = msg.properties
    if p is not EMPTY or msg.expires_at is not None:
        mp = env.properties
        if p.payload_format_indicator is not None:
            mp.payload_format_indicator = p.payload_format_indicator
        if msg.expires_at is not None:
            mp.message_expiry_interval_s = max(0, round(msg.expires_at - msg.published_at))
        if p.content_type is not None:
            mp.content_type = p.content_type
        if p.response_topic is not None:
            mp.response_topic = p.response_topic
        if p.correlation_data is not None:
            mp.correlation_data = p.correlation_data
        for k, v in p.user_property:
            mp.user_properties.append(UserProperty(key=k, value=v))
    if msg.trace_context:
        env.trace_context.update(dict(msg.trace_context))
    return env


def _body(env: RoutedMessage, msg: Message, message_id: str) -> None:
    # Field by field: cheaper than keyword arguments (0.50 against 0.69 us), and than a dict.
    env.topic = msg.topic
    env.payload = msg.payload
    env.qos = msg.qos
    env.retain = msg.retain
    env.published_at_ms = int(msg.published_at * 1000)
    env.message_id = message_id


def _fill(env: RoutedMessage, msg: Message, node_id: str, message_id: str) -> RoutedMessage:
    env.tenant = msg.tenant
    _body(env, msg, message_id)
    return _finish(env, msg, node_id)


def shared_part(tenant: str, client_id: str, node_id: str) -> bytes:
    """The encoded fields that every envelope of one publisher's messages shares (tenant and
    publisher), for `fill_shared`."""
    env = RoutedMessage(tenant=tenant)
    env.publisher.client_id = client_id
    env.publisher.node_id = node_id
    return env.SerializeToString()


def fill_shared(env: RoutedMessage, shared: bytes, msg: Message, message_id: str) -> RoutedMessage:
    """`env` (new) made the envelope `to_envelope` makes of `msg`, whose tenant and publisher
    `shared` encodes (`shared_part`). Merging those two from bytes instead of setting them
    (the publisher is a nested message, a Python object of its own) makes an envelope about a
    third cheaper (0.95 against 1.49 µs, measured side by side)."""
    env.MergeFromString(shared)
    _body(env, msg, message_id)
    return _extras(env, msg)


def to_envelope(msg: Message, node_id: str, message_id: str) -> RoutedMessage:
    return _fill(RoutedMessage(), msg, node_id, message_id)


def add_to_batch(batch: RoutedBatch, msg: Message, node_id: str, message_id: str) -> RoutedMessage:
    """Append `msg` to `batch` in place (no intermediate message to copy)."""
    return _fill(batch.messages.add(), msg, node_id, message_id)


def _properties(mp: MessageProperties) -> Properties:
    props = Properties(
        payload_format_indicator=(
            mp.payload_format_indicator if mp.HasField("payload_format_indicator") else None
        ),
        content_type=mp.content_type if mp.HasField("content_type") else None,
        response_topic=mp.response_topic if mp.HasField("response_topic") else None,
        correlation_data=mp.correlation_data if mp.HasField("correlation_data") else None,
        user_property=tuple((u.key, u.value) for u in mp.user_properties),
    )
    return EMPTY if props == EMPTY else props


def from_envelope(
    env: RoutedMessage,
    qos: int | None = None,
    retain: bool | None = None,
    expires_at_ms: int = 0,
) -> Message:
    """The message of `env`; a queue entry passes its own delivery `qos`, `retain` and
    expiry (`expires_at_ms`, 0: the message's own), so the message is built once, not
    built and then copied with those replaced (once per delivered entry: it counts)."""
    published_at = env.published_at_ms / 1000
    props = EMPTY
    expires_at = None
    if env.HasField("properties"):
        mp: MessageProperties = env.properties
        if mp.HasField("message_expiry_interval_s"):
            expires_at = published_at + mp.message_expiry_interval_s
        props = _properties(mp)
    if expires_at_ms:
        expires_at = expires_at_ms / 1000
    tc = env.trace_context  # a map view costs even when empty: only made for sampled ones
    return Message(
        env.tenant,
        env.topic,
        env.payload,
        env.qos if qos is None else qos,
        env.retain if retain is None else retain,
        env.publisher.client_id,
        props,
        expires_at,
        published_at,
        tuple(tc.items()) if tc else (),
    )


__all__ = ["add_to_batch", "fill_shared", "from_envelope", "shared_part", "to_envelope"]
