"""What the registry keeps of a CONNECT's will (services/session/wills.py): only what its
connection may publish and what fits `will_store_max_bytes`, and it reads back whole."""

from __future__ import annotations

import base64
import json

from services.common.acl import Access, AclRule
from services.common.mqtt.packets import Will
from services.common.mqtt.properties import Properties
from services.connection.wills import will_envelope
from services.session.registry import Holder, _decode, _encode
from services.session.wills import kept_will
from starling.common.v1.message_pb2 import RoutedMessage


def _envelope(topic: str, payload: bytes = b"bye") -> bytes:
    will = Will(topic, payload, 1, True, Properties(message_expiry_interval=30))
    return will_envelope(will, "dev-1", "node-a", 1000.0)


def test_a_will_the_acl_allows_is_kept_whole() -> None:
    kept = kept_will(_envelope("status/dev-1"), [], True, 1024)
    env = RoutedMessage.FromString(base64.b64decode(kept))
    assert (env.topic, env.payload, env.qos, env.retain) == ("status/dev-1", b"bye", 1, True)
    assert env.publisher.client_id == "dev-1"
    assert env.properties.message_expiry_interval_s == 30  # counted from its publication


def test_a_will_the_acl_refuses_or_too_large_is_not_kept() -> None:
    deny = [AclRule(False, Access.PUBLISH, "secret/#")]
    assert kept_will(_envelope("secret/x"), deny, True, 1024) == ""
    assert kept_will(_envelope("status/x"), [], False, 1024) == ""  # default deny
    allow = [AclRule(True, Access.PUBLISH, "status/+")]
    assert kept_will(_envelope("status/x"), allow, False, 1024) != ""
    big = _envelope("status/x", b"x" * 2000)
    assert kept_will(big, [], True, 1024) == ""
    assert kept_will(big, [], True, len(big)) != ""
    assert kept_will(b"", [], True, 1024) == ""
    assert kept_will(b"\xff\xfe not an envelope", [], True, 1024) == ""


def test_the_registry_entry_carries_the_will_and_omits_it_when_there_is_none() -> None:
    with_will = Holder("t", "c", "node-a", 7, will="d2lsbA==", will_delay_s=5)
    assert _decode(_encode(with_will)) == with_will
    plain = Holder("t", "c", "node-a", 7)
    assert "will" not in json.loads(_encode(plain))
    assert _decode(_encode(plain)) == plain
