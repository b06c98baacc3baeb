"""Golden table of raw MQTT packets: (id naming the spec statement, level, bytes, outcome).

The outcome is a packet (valid input) or a reason code (the decoder must raise an MqttError
carrying it). Reused by codec tests and by the end-to-end malformed-input tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PubAck,
    Publish,
    PubRel,
    Subscribe,
    Subscription,
    Unsubscribe,
    Will,
)
from services.common.mqtt.properties import Properties


@dataclass(frozen=True)
class Golden:
    id: str
    level: int
    raw: bytes
    expect: Packet | int


def h(s: str) -> bytes:
    return bytes.fromhex(s.replace(" ", ""))


GOLDEN: list[Golden] = [
    # ---- valid ---------------------------------------------------------------------------
    Golden(
        "connect-v311-minimal",
        4,
        h("10 0c 0004 4d515454 04 02 003c 0000"),
        Connect("", 4, "MQTT", True, 60),
    ),
    Golden(
        "connect-v31-MQIsdp",
        3,
        h("10 10 0006 4d5149736470 03 02 003c 0002 6331"),
        Connect("c1", 3, "MQIsdp", True, 60),
    ),
    Golden("publish-qos0", 4, h("30 07 0003 612f62 6869"), Publish("a/b", b"hi")),
    Golden(
        "publish-qos1-dup-retain",
        4,
        h("3b 09 0003 612f62 0007 6869"),
        Publish("a/b", b"hi", 1, True, True, 7),
    ),
    Golden(
        "publish-v5-props",
        5,
        h("32 0f 0003 612f62 0007 05 02 0000003c 6869"),
        Publish("a/b", b"hi", 1, False, False, 7, Properties(message_expiry_interval=60)),
    ),
    Golden("puback-v5-short-form [MQTT-3.4.2-1]", 5, h("40 02 0007"), PubAck(7)),
    Golden("puback-v311", 4, h("40 02 fffe"), PubAck(65534)),
    Golden("puback-v5-reason", 5, h("40 03 0007 10"), PubAck(7, 0x10)),
    Golden("pubrel-flags-2", 4, h("62 02 0007"), PubRel(7)),
    Golden(
        "subscribe-v311", 4, h("82 08 0001 0003 612f23 01"), Subscribe(1, (Subscription("a/#", 1),))
    ),
    Golden(
        "subscribe-v5-options",
        5,
        h("82 09 0001 02 0b05 0001 61 2e"),
        Subscribe(
            1, (Subscription("a", 2, True, True, 2),), Properties(subscription_identifier=(5,))
        ),
    ),
    Golden("unsubscribe-v311", 4, h("a2 05 0002 0001 61"), Unsubscribe(2, ("a",))),
    Golden("pingreq", 4, h("c0 00"), PingReq()),
    Golden("disconnect-v5-reason", 5, h("e0 01 04"), Disconnect(4)),
    Golden("connack-v311-refused-4", 4, h("20 02 00 04"), ConnAck(False, 0x86)),
    # ---- malformed / protocol errors -------------------------------------------------------
    Golden("[MQTT-2.1.3-1] pubrel-bad-flags", 4, h("60 02 0007"), 0x81),
    Golden("[MQTT-2.1.3-1] subscribe-bad-flags", 4, h("80 06 0001 0001 61 00"), 0x81),
    Golden("[MQTT-2.1.3-1] pingreq-flags", 4, h("c1 00"), 0x81),
    Golden("[MQTT-3.3.1-4] publish-qos3", 4, h("36 05 0001 61 0001"), 0x81),
    Golden("[MQTT-3.3.1-2] publish-dup-qos0", 4, h("38 03 0001 61"), 0x81),
    Golden("[MQTT-2.2.1-3] publish-packet-id-0", 4, h("32 05 0001 61 0000"), 0x81),
    Golden("[MQTT-2.2.1-3] puback-packet-id-0", 4, h("40 02 0000"), 0x81),
    Golden("[MQTT-2.1.3-1] puback-bad-flags", 4, h("41 02 0007"), 0x81),
    Golden("[MQTT-1.5.5-1] remaining-length-5-bytes", 4, h("30 ff ff ff ff 01"), 0x81),
    # A longer encoding than the value needs (a last byte of 0): C0 80 00 is a PINGREQ whose
    # remaining length takes two bytes instead of one.
    Golden("[MQTT-1.5.5-1] remaining-length-not-shortest", 4, h("c0 80 00"), 0x81),
    Golden("[MQTT-1.5.5-1] property-length-not-shortest", 5, h("30 05 0001 61 8000"), 0x81),
    Golden("[MQTT-1.5.4-1] topic-bad-utf8", 4, h("30 04 0002 c328"), 0x81),
    Golden("[MQTT-1.5.4-1] topic-utf16-surrogate", 4, h("30 05 0003 eda080"), 0x81),
    Golden("[MQTT-1.5.4-2] topic-nul", 4, h("30 04 0002 6100"), 0x81),
    Golden(
        "[MQTT-3.1.2-3] connect-reserved-flag", 4, h("10 0c 0004 4d515454 04 03 003c 0000"), 0x81
    ),
    Golden(
        "[MQTT-3.1.2-11] connect-will-qos-without-will",
        4,
        h("10 0c 0004 4d515454 04 0a 003c 0000"),
        0x81,
    ),
    Golden(
        "[MQTT-3.1.2-12] connect-will-qos3",
        4,
        h("10 12 0004 4d515454 04 1e 003c 0000 0001 74 0001 78"),
        0x81,
    ),
    Golden(
        "[MQTT-3.1.2-22] connect-v311-password-without-username",
        4,
        h("10 0f 0004 4d515454 04 42 003c 0000 0001 70"),
        0x81,
    ),
    Golden(
        "[MQTT-3.1.2-2] connect-unsupported-level",
        4,
        h("10 0c 0004 4d515454 07 02 003c 0000"),
        0x84,
    ),
    Golden(
        "[MQTT-3.1.2-1] connect-bad-protocol-name",
        4,
        h("10 0c 0004 4d515458 04 02 003c 0000"),
        0x84,
    ),
    Golden("[MQTT-3.8.3-3] subscribe-no-filters", 4, h("82 02 0001"), 0x82),
    Golden("[MQTT-3-8.3-4] subscribe-qos3", 4, h("82 06 0001 0001 61 03"), 0x81),
    Golden(
        "[MQTT-3.8.3-5] subscribe-v5-reserved-option-bits", 5, h("82 07 0001 00 0001 61 c0"), 0x81
    ),
    Golden("[MQTT-3.8.3-4] subscribe-v311-reserved-bits", 4, h("82 06 0001 0001 61 04"), 0x81),
    Golden("[MQTT-3.10.3-2] unsubscribe-no-filters", 4, h("a2 02 0001"), 0x82),
    Golden(
        "[MQTT-2.2.2-2] property-repeated",
        5,
        h("30 0f 0001 61 0a 02 00000001 02 00000002 78"),
        0x82,
    ),
    Golden(
        "[MQTT-2.2.2-1] property-not-allowed-in-packet", 5, h("30 08 0001 61 03 210001 78"), 0x81
    ),
    Golden("[MQTT-3.3.2-8] topic-alias-zero", 5, h("30 08 0001 61 03 230000 78"), 0x94),
    Golden(
        "[MQTT-3.3.2-14] response-topic-wildcard", 5, h("30 0a 0001 61 06 08 0003 722f2b"), 0x82
    ),
    Golden("[MQTT-3.3.2.3.2] payload-format-indicator-2", 5, h("30 07 0001 61 02 0102 78"), 0x82),
    Golden("property-unknown-identifier", 5, h("30 07 0001 61 02 7f00 78"), 0x81),
    Golden("property-length-past-end", 5, h("30 04 0001 61 09"), 0x81),
    Golden("reserved-packet-type-0", 4, h("00 00"), 0x81),
    Golden("[MQTT-3.12.4] pingreq-with-body", 4, h("c0 01 00"), 0x81),
    Golden("disconnect-v311-with-body", 4, h("e0 01 00"), 0x81),
    Golden("[MQTT-3.15] auth-in-v311", 4, h("f0 00"), 0x81),
    Golden("puback-v5-invalid-reason", 5, h("40 03 0007 05"), 0x81),
    Golden("publish-topic-length-past-end", 4, h("30 03 0005 61"), 0x81),
    Golden("connect-trailing-bytes", 4, h("10 0d 0004 4d515454 04 02 003c 0000 00"), 0x81),
]

# A will-carrying MQTT 5 CONNECT, built by the encoder in the tests.
WILL_CONNECT = Connect(
    "c1",
    5,
    "MQTT",
    False,
    10,
    "u",
    b"pw",
    Will("w/t", b"bye", 1, True, Properties(will_delay_interval=5)),
    Properties(session_expiry_interval=10),
)
