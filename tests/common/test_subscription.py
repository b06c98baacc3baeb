"""The one conversion between a persistent subscription and `starling.common.v1.Subscription`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.common.mqtt.packets import Subscription
from services.common.store.ports_session import SubscriptionRecord
from services.common.subscription import (
    identified_from_pb,
    identified_to_pb,
    record_from_pb,
    record_to_pb,
)

subscriptions = st.builds(
    Subscription,
    st.text(min_size=1, max_size=20),
    st.integers(0, 2),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2),
)
ids = st.none() | st.integers(1, 268_435_455)


@given(subscriptions, ids)
def test_identified_subscriptions_round_trip(sub: Subscription, sub_id: int | None) -> None:
    wire = identified_to_pb(sub, sub_id)
    assert wire.subscription_identifier == (sub_id or 0)  # 0 on the wire: none
    assert identified_from_pb(type(wire).FromString(wire.SerializeToString())) == (sub, sub_id)


@given(subscriptions, st.integers(0, 268_435_455))
def test_records_round_trip(sub: Subscription, sub_id: int) -> None:
    rec = SubscriptionRecord(
        "t", "c", 7, sub.filter, sub.qos, sub.no_local, sub.retain_as_published,
        sub.retain_handling, sub_id,
    )  # fmt: skip
    assert record_from_pb("t", "c", 7, record_to_pb(rec)) == rec
    assert record_to_pb(rec) == identified_to_pb(sub, sub_id)  # one wire shape for both
