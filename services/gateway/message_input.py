"""What an HTTP publish says, checked: EMQX's `POST /api/v5/publish` JSON object to a
`PublishItem`, or `BadInputError` whose message is the reason a 400 carries (pure: no I/O).

The shape follows EMQX 5 so that tools written for it work: `topic`, `payload`, `qos`,
`retain`, `payload_encoding` (`plain`, the default, or `base64`), and `properties` with
`payload_format_indicator`, `message_expiry_interval`, `content_type`, `response_topic`,
`correlation_data` and `user_properties` (an object of string values). `tenant` names the
tenant when the operator token publishes; `clientid` the publisher shown downstream. A topic
`$delayed/{seconds}/{topic}` is a delayed publish, as from a node.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass

from services.common.mqtt.errors import MqttError
from services.common.mqtt.properties import EMPTY, Properties
from services.common.topics import is_sys_topic, validate_topic_name
from services.common.topics.delayed import DELAYED_PREFIX, parse_delayed

_KNOWN = frozenset(
    {"topic", "payload", "qos", "retain", "payload_encoding", "properties", "tenant", "clientid"}
)
_PROPERTIES = frozenset(
    {
        "payload_format_indicator",
        "message_expiry_interval",
        "content_type",
        "response_topic",
        "correlation_data",
        "user_properties",
    }
)
MAX_EXPIRY_S = 0xFFFFFFFF  # a four-byte integer, as in MQTT 5
MAX_CLIENT_ID_CHARS = 256


class BadInputError(ValueError):
    """The request cannot be published as it is; the message says why (a 400's reason)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishItem:
    topic: str  # the topic it is published on ($delayed/ prefix taken off)
    payload: bytes
    qos: int
    retain: bool
    properties: Properties = EMPTY
    expiry_s: int | None = None  # Message Expiry Interval
    delay_s: int = 0  # from a `$delayed/{seconds}/` topic
    tenant: str = ""  # named by the request ("": the caller's own)
    client_id: str = ""  # the publisher as the request names it


@dataclass(frozen=True, slots=True)
class InputLimits:
    max_payload_bytes: int
    max_bulk: int


def parse_item(obj: object, limits: InputLimits) -> PublishItem:
    """One publish object; BadInputError naming the first thing wrong."""
    if not isinstance(obj, Mapping):
        raise BadInputError("a publish must be a JSON object")
    unknown = sorted(set(obj) - _KNOWN)
    if unknown:
        raise BadInputError(f"unknown field {unknown[0]!r}")
    topic, delay_s = _topic(obj.get("topic"))
    qos = obj.get("qos", 0)
    if not isinstance(qos, int) or isinstance(qos, bool) or qos not in (0, 1, 2):
        raise BadInputError("qos must be 0, 1 or 2")
    retain = obj.get("retain", False)
    if not isinstance(retain, bool):
        raise BadInputError("retain must be true or false")
    payload = _payload(obj.get("payload", ""), obj.get("payload_encoding", "plain"), limits)
    props, expiry_s = _properties(obj.get("properties"))
    if props.payload_format_indicator == 1:
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError:
            raise BadInputError("payload_format_indicator 1 but the payload is not UTF-8") from None
    return PublishItem(
        topic=topic,
        payload=payload,
        qos=qos,
        retain=retain,
        properties=props,
        expiry_s=expiry_s,
        delay_s=delay_s,
        tenant=_text(obj.get("tenant", ""), "tenant", 64),
        client_id=_text(obj.get("clientid", ""), "clientid", MAX_CLIENT_ID_CHARS),
    )


def parse_bulk(obj: object, limits: InputLimits) -> list[PublishItem]:
    """A bulk request: a non-empty list of publish objects, all valid, or BadInputError
    naming the index of the first bad one."""
    if not isinstance(obj, list):
        raise BadInputError("a bulk publish must be a JSON list")
    if not obj:
        raise BadInputError("a bulk publish must not be empty")
    if len(obj) > limits.max_bulk:
        raise BadInputError(
            f"{len(obj)} messages in one bulk publish; at most {limits.max_bulk} "
            "(gateway_http_max_bulk)"
        )
    items = []
    for i, entry in enumerate(obj):
        try:
            items.append(parse_item(entry, limits))
        except BadInputError as exc:
            raise BadInputError(f"[{i}]: {exc}") from None
    return items


def _topic(topic: object) -> tuple[str, int]:
    if not isinstance(topic, str):
        raise BadInputError("topic is required (a string)")
    delay_s = 0
    if topic.startswith(DELAYED_PREFIX):
        delayed = parse_delayed(topic)
        if delayed is None:
            raise BadInputError("a $delayed topic is $delayed/{seconds}/{topic}")
        topic, delay_s = delayed.topic, delayed.seconds
    try:
        validate_topic_name(topic)
    except MqttError as exc:
        raise BadInputError(f"invalid topic: {exc}") from None
    if is_sys_topic(topic):
        raise BadInputError("invalid topic: $SYS topics are the server's own")
    if "\x00" in topic:
        raise BadInputError("invalid topic: it contains U+0000")
    return topic, delay_s


def _payload(payload: object, encoding: object, limits: InputLimits) -> bytes:
    if not isinstance(payload, str):
        raise BadInputError("payload must be a string")
    if encoding == "plain":
        data = payload.encode()
    elif encoding == "base64":
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise BadInputError("payload is not valid base64") from None
    else:
        raise BadInputError("payload_encoding must be 'plain' or 'base64'")
    if len(data) > limits.max_payload_bytes:
        raise BadInputError(
            f"payload of {len(data)} bytes; at most {limits.max_payload_bytes} "
            "(gateway_max_payload_bytes)"
        )
    return data


def _properties(props: object) -> tuple[Properties, int | None]:
    if props is None:
        return EMPTY, None
    if not isinstance(props, Mapping):
        raise BadInputError("properties must be a JSON object")
    unknown = sorted(set(props) - _PROPERTIES)
    if unknown:
        raise BadInputError(f"unknown property {unknown[0]!r}")
    pfi = props.get("payload_format_indicator")
    if pfi is not None and (isinstance(pfi, bool) or pfi not in (0, 1)):
        raise BadInputError("payload_format_indicator must be 0 or 1")
    expiry = props.get("message_expiry_interval")
    if expiry is not None and (
        not isinstance(expiry, int) or isinstance(expiry, bool) or not 0 <= expiry <= MAX_EXPIRY_S
    ):
        raise BadInputError("message_expiry_interval must be an integer of seconds")
    correlation = props.get("correlation_data")
    built = Properties(
        payload_format_indicator=pfi,
        content_type=_optional_text(props.get("content_type"), "content_type"),
        response_topic=_response_topic(props.get("response_topic")),
        correlation_data=None
        if correlation is None
        else _text(correlation, "correlation_data", 65535).encode(),
        user_property=_user_properties(props.get("user_properties")),
    )
    return (EMPTY if built.is_empty() else built), expiry


def _response_topic(value: object) -> str | None:
    topic = _optional_text(value, "response_topic")
    if topic is not None:
        try:
            validate_topic_name(topic)
        except MqttError as exc:
            raise BadInputError(f"invalid response_topic: {exc}") from None
    return topic


def _user_properties(value: object) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise BadInputError("user_properties must be an object of strings")
    pairs = []
    for k, v in value.items():
        if not isinstance(v, str):
            raise BadInputError(f"user property {k!r} must be a string")
        pairs.append((_text(k, "user property name", 65535), _text(v, "user property", 65535)))
    return tuple(pairs)


def _optional_text(value: object, name: str) -> str | None:
    return None if value is None else _text(value, name, 65535)


def _text(value: object, name: str, max_chars: int) -> str:
    if not isinstance(value, str):
        raise BadInputError(f"{name} must be a string")
    if len(value) > max_chars:
        raise BadInputError(f"{name} longer than {max_chars} characters")
    return value
