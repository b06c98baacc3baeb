"""The node's cheaper envelopes (services/connection/ingress.py): the routing pipeline budgets
its batches with `envelope_size_bound` instead of encoding each envelope to count it (the
bound is never below the encoded size), and an envelope filled from its publisher's shared
part is the envelope `to_envelope` makes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.common.envelope import fill_shared, shared_part, to_envelope
from services.common.message import Message
from services.common.message_size import message_bytes
from services.common.mqtt.properties import EMPTY, Properties
from services.connection.ingress import envelope_size_bound
from starling.common.v1.message_pb2 import RoutedMessage

names = st.text(max_size=80)


@given(
    tenant=names,
    topic=st.text(min_size=1, max_size=300),
    payload=st.binary(max_size=70_000),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    publisher=names,
    node_id=names,
    message_id=names,
    published_at=st.floats(0, 4e9),
)
def test_the_bound_is_at_least_the_encoded_size(
    tenant: str,
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    publisher: str,
    node_id: str,
    message_id: str,
    published_at: float,
) -> None:
    msg = Message(tenant, topic, payload, qos, retain, publisher, published_at=published_at)
    env = to_envelope(msg, node_id, message_id)
    body = message_bytes(topic, payload)
    assert envelope_size_bound(msg, body, node_id, message_id) >= env.ByteSize()


@given(
    tenant=names,
    topic=st.text(min_size=1, max_size=40),
    payload=st.binary(max_size=100),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    publisher=names,
    message_id=names,
    published_at=st.floats(0, 4e9),
    expires_in=st.none() | st.integers(0, 1000),
    content_type=st.none() | names,
    user=st.lists(st.tuples(names, names), max_size=3),
    trace=st.lists(st.tuples(names, names), max_size=2, unique_by=lambda kv: kv[0]),
)
def test_an_envelope_filled_from_its_shared_part_is_the_same_envelope(
    tenant: str,
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    publisher: str,
    message_id: str,
    published_at: float,
    expires_in: int | None,
    content_type: str | None,
    user: list[tuple[str, str]],
    trace: list[tuple[str, str]],
) -> None:
    props = Properties(content_type=content_type, user_property=tuple(user))
    msg = Message(
        tenant,
        topic,
        payload,
        qos,
        retain,
        publisher,
        EMPTY if props == EMPTY else props,
        None if expires_in is None else published_at + expires_in,
        published_at,
        tuple(trace),
    )
    shared = shared_part(tenant, publisher, "node-0")
    assert fill_shared(RoutedMessage(), shared, msg, message_id) == to_envelope(
        msg, "node-0", message_id
    )
