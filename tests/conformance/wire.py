"""Raw-socket helpers for the conformance suite: what a client sees on the wire.

Every check reads packets as a client decodes them. "Nothing arrives" is proven with a
sentinel the same publisher sends afterwards on an ordered path, never by sleeping.
"""

from __future__ import annotations

import uuid

from services.common.mqtt import (
    EMPTY,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    Properties,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from tests.e2e.clients import Raw


def uid(prefix: str) -> str:
    """A client id or topic level no other test of the session uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def connect(
    port: int,
    client_id: str | None = None,
    level: int = 5,
    props: Properties = EMPTY,
    **fields: object,
) -> tuple[Raw, ConnAck]:
    """A raw client and the CONNACK it got (accepted or not)."""
    raw = Raw(port, level)
    name = "MQIsdp" if level == 3 else "MQTT"
    ack = raw.connect(
        Connect(
            uid("cf") if client_id is None else client_id,
            level,
            protocol_name=name,
            properties=props,
            **fields,
        )  # type: ignore[arg-type]
    )
    assert isinstance(ack, ConnAck), ack
    return raw, ack


def connected(port: int, client_id: str | None = None, level: int = 5, **kw: object) -> Raw:
    raw, ack = connect(port, client_id, level, **kw)  # type: ignore[arg-type]
    assert ack.reason_code == 0, f"CONNACK 0x{ack.reason_code:02x}"
    return raw


def subscribe(raw: Raw, *subs: Subscription, pid: int = 1, props: Properties = EMPTY) -> SubAck:
    raw.send(Subscribe(pid, subs, props))
    ack = raw.recv()
    assert isinstance(ack, SubAck) and ack.packet_id == pid, ack
    return ack


def publish_acked(raw: Raw, p: Publish) -> PubAck:
    """Publish at QoS 1 and return its PUBACK."""
    raw.send(p)
    ack = raw.recv()
    assert isinstance(ack, PubAck) and ack.packet_id == p.packet_id, ack
    return ack


def disconnected_with(raw: Raw, code: int) -> Disconnect:
    """The server sent DISCONNECT with `code`, then closed the connection."""
    pkt = raw.recv()
    assert isinstance(pkt, Disconnect), pkt
    assert pkt.reason_code == code, f"DISCONNECT 0x{pkt.reason_code:02x}, wanted 0x{code:02x}"
    assert raw.closed()
    return pkt


def closed_silently(raw: Raw) -> None:
    """The server closed the connection without sending anything (3.1.1 style)."""
    assert raw.closed()
    assert not raw.pending, raw.pending


def next_publish(raw: Raw, ack: bool = True) -> Publish:
    """The next PUBLISH (skipping nothing: any other packet fails), acknowledged at QoS 1."""
    pkt = raw.recv()
    assert isinstance(pkt, Publish), pkt
    if ack and pkt.qos == 1:
        raw.send(PubAck(pkt.packet_id or 0))
    return pkt


def payloads(packets: list[Packet]) -> list[bytes]:
    return [p.payload for p in packets if isinstance(p, Publish)]
