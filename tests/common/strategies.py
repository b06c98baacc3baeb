"""Hypothesis strategies for every MQTT packet type at every protocol level."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from services.common.mqtt import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from services.common.mqtt.properties import (
    BOOLEAN_BYTES,
    EMPTY,
    NONZERO,
    PROPERTY_SPECS,
    WILL,
    Properties,
    PropKind,
)
from services.common.mqtt.reason import PacketType as PT

text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)
binary = st.binary(max_size=24)
pid = st.integers(1, 65535)


def _value(ident: int, kind: PropKind) -> st.SearchStrategy[Any]:
    lo = 1 if ident in NONZERO else 0
    if kind is PropKind.BYTE:
        return st.integers(0, 1) if ident in BOOLEAN_BYTES else st.integers(0, 255)
    if kind is PropKind.U16:
        return st.integers(lo, 65535)
    if kind is PropKind.U32:
        return st.integers(lo, 2**32 - 1)
    if kind is PropKind.VARINT:
        return st.integers(lo, 268_435_455)
    if kind is PropKind.UTF8:
        # A Response Topic is a topic name: no wildcards [MQTT-3.3.2-14].
        return text.filter(lambda t: "+" not in t and "#" not in t) if ident == 0x08 else text
    if kind is PropKind.BINARY:
        return binary
    return st.tuples(text, text)


def properties(where: int) -> st.SearchStrategy[Properties]:
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for spec in PROPERTY_SPECS.values():
        if where not in spec.allowed_in:
            continue
        v = _value(spec.ident, spec.kind)
        if spec.name == "user_property":
            fields[spec.name] = st.lists(v, max_size=3).map(tuple)
        elif spec.name == "subscription_identifier":
            n = 1 if where == PT.SUBSCRIBE else 3
            fields[spec.name] = st.lists(v, max_size=n).map(tuple)
        else:
            fields[spec.name] = st.none() | v
    return st.fixed_dictionaries({}, optional=fields).map(
        lambda d: Properties(**d) if any(v not in (None, ()) for v in d.values()) else EMPTY
    )


def _props(level: int, where: int) -> st.SearchStrategy[Properties]:
    return properties(where) if level == 5 else st.just(EMPTY)


@st.composite
def connect(draw: st.DrawFn, level: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(text),
            draw(binary),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(_props(level, WILL)),
        )
    username = draw(st.none() | text)
    password = draw(st.none() | binary)
    if level < 5 and username is None:
        password = None
    return Connect(
        draw(text),
        level,
        "MQIsdp" if level == 3 else "MQTT",
        draw(st.booleans()),
        draw(st.integers(0, 65535)),
        username,
        password,
        will,
        draw(_props(level, PT.CONNECT)),
    )


@st.composite
def publish(draw: st.DrawFn, level: int) -> Publish:
    qos = draw(st.integers(0, 2))
    return Publish(
        draw(text),
        draw(binary),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(pid) if qos else None,
        draw(_props(level, PT.PUBLISH)),
    )


def _ack(cls: Any, ptype: int, codes: list[int], level: int) -> st.SearchStrategy[Any]:
    if level < 5:
        return st.builds(cls, pid)
    return st.builds(cls, pid, st.sampled_from(codes), properties(ptype))


@st.composite
def subscribe(draw: st.DrawFn, level: int) -> Subscribe:
    subs = []
    for _ in range(draw(st.integers(1, 3))):
        if level == 5:
            subs.append(
                Subscription(
                    draw(text),
                    draw(st.integers(0, 2)),
                    draw(st.booleans()),
                    draw(st.booleans()),
                    draw(st.integers(0, 2)),
                )
            )
        else:
            subs.append(Subscription(draw(text), draw(st.integers(0, 2))))
    return Subscribe(draw(pid), tuple(subs), draw(_props(level, PT.SUBSCRIBE)))


def packets(level: int) -> st.SearchStrategy[Any]:
    pub_codes = [0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99]
    rel_codes = [0x00, 0x92]
    v3_connack = [0x00, 0x84, 0x85, 0x88, 0x86, 0x87]
    choices = [
        connect(level),
        st.builds(
            ConnAck,
            st.booleans(),
            st.sampled_from(v3_connack) if level < 5 else st.integers(0, 255),
            _props(level, PT.CONNACK),
        ),
        publish(level),
        _ack(PubAck, PT.PUBACK, pub_codes, level),
        _ack(PubRec, PT.PUBREC, pub_codes, level),
        _ack(PubRel, PT.PUBREL, rel_codes, level),
        _ack(PubComp, PT.PUBCOMP, rel_codes, level),
        subscribe(level),
        st.builds(
            SubAck,
            pid,
            st.lists(st.sampled_from([0, 1, 2, 0x80]), min_size=1, max_size=4).map(tuple),
            _props(level, PT.SUBACK),
        ),
        st.builds(
            Unsubscribe,
            pid,
            st.lists(text, min_size=1, max_size=3).map(tuple),
            _props(level, PT.UNSUBSCRIBE),
        ),
        (
            st.builds(
                UnsubAck,
                pid,
                st.lists(st.integers(0, 255), max_size=3).map(tuple),
                properties(PT.UNSUBACK),
            )
            if level == 5
            else st.builds(UnsubAck, pid)
        ),
        st.just(PingReq()),
        st.just(PingResp()),
        (
            st.builds(Disconnect, st.integers(0, 255), properties(PT.DISCONNECT))
            if level == 5
            else st.just(Disconnect())
        ),
    ]
    if level == 5:
        choices.append(st.builds(Auth, st.sampled_from([0x00, 0x18, 0x19]), properties(PT.AUTH)))
    return st.one_of(choices)
