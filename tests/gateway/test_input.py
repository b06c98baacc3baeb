"""The gateway's pure parts: an HTTP publish's JSON checked (message_input.py) and the
per-address request rate (address_rate.py)."""

from __future__ import annotations

import pytest

from services.common.mqtt.properties import EMPTY
from services.gateway.address_rate import AddressRate
from services.gateway.message_input import BadInputError, InputLimits, parse_bulk, parse_item

LIMITS = InputLimits(max_payload_bytes=16, max_bulk=3)


def test_a_full_publish_is_read() -> None:
    item = parse_item(
        {
            "topic": "$delayed/5/a/b",
            "payload": "aGk=",
            "payload_encoding": "base64",
            "qos": 2,
            "retain": True,
            "clientid": "c",
            "properties": {
                "payload_format_indicator": 1,
                "message_expiry_interval": 30,
                "user_properties": {"k": "v"},
            },
        },
        LIMITS,
    )
    assert (item.topic, item.delay_s, item.payload, item.qos, item.retain) == (
        "a/b",
        5,
        b"hi",
        2,
        True,
    )
    assert item.expiry_s == 30
    assert item.properties.user_property == (("k", "v"),)
    assert item.client_id == "c"
    assert parse_item({"topic": "t"}, LIMITS).properties is EMPTY


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"topic": "t", "payload": "x" * 17}, "at most 16"),
        (
            {
                "topic": "t",
                "payload": "/w==",
                "payload_encoding": "base64",
                "properties": {"payload_format_indicator": 1},
            },
            "not UTF-8",
        ),
        ({"topic": "t", "qos": True}, "qos"),
        ({"topic": "t", "properties": {"message_expiry_interval": -1}}, "expiry"),
        ({"topic": "t", "properties": {"response_topic": "a/#"}}, "response_topic"),
        ({"topic": "$delayed/x/t"}, "$delayed"),
        ({"topic": ""}, "empty"),
        ({"topic": "a\x00b"}, "U+0000"),
    ],
)
def test_bad_publishes_are_refused_with_their_reason(body: dict[str, object], reason: str) -> None:
    with pytest.raises(BadInputError, match=None) as caught:
        parse_item(body, LIMITS)
    assert reason in str(caught.value)


def test_bulk_bounds() -> None:
    assert len(parse_bulk([{"topic": "a"}] * 3, LIMITS)) == 3
    with pytest.raises(BadInputError, match="at most 3"):
        parse_bulk([{"topic": "a"}] * 4, LIMITS)
    with pytest.raises(BadInputError, match=r"^\[2\]: "):
        parse_bulk([{"topic": "a"}, {"topic": "b"}, {"topic": "#"}], LIMITS)


def test_address_rate_per_second_and_bounded() -> None:
    rate = AddressRate(per_s=2, max_addresses=2)
    assert rate.admit("a", 10.0) is None
    assert rate.admit("a", 10.1) is None
    assert rate.admit("a", 10.5) == pytest.approx(0.5)
    assert rate.admit("b", 10.5) is None
    assert rate.admit("c", 10.6) is not None  # the table is full for this second
    assert rate.admit("a", 11.0) is None  # a new window
    assert AddressRate(per_s=0).admit("a", 1.0) is None
