"""The one conversion between a persistent subscription and its protobuf
(`starling.common.v1.Subscription`).

Two domain shapes meet the one wire message: what a connection node holds, a codec
`Subscription` with its identifier (`IdentifiedSubscription`), and what the router and the
session store keep, a `SubscriptionRecord` (the same plus tenant, client id and incarnation).
On the wire, subscription identifier 0 means "none".
"""

from __future__ import annotations

from services.common.connect import IdentifiedSubscription
from services.common.mqtt.packets import Subscription
from services.common.store.ports_session import SubscriptionRecord
from starling.common.v1.subscription_pb2 import Subscription as SubscriptionPb


def identified_to_pb(sub: Subscription, subscription_id: int | None) -> SubscriptionPb:
    return SubscriptionPb(
        topic_filter=sub.filter,
        qos=sub.qos,
        no_local=sub.no_local,
        retain_as_published=sub.retain_as_published,
        retain_handling=sub.retain_handling,
        subscription_identifier=subscription_id or 0,
    )


def identified_from_pb(p: SubscriptionPb) -> IdentifiedSubscription:
    sub = Subscription(p.topic_filter, p.qos, p.no_local, p.retain_as_published, p.retain_handling)
    return sub, p.subscription_identifier or None


def record_to_pb(rec: SubscriptionRecord) -> SubscriptionPb:
    return SubscriptionPb(
        topic_filter=rec.topic_filter,
        qos=rec.qos,
        no_local=rec.no_local,
        retain_as_published=rec.retain_as_published,
        retain_handling=rec.retain_handling,
        subscription_identifier=rec.subscription_identifier,
    )


def record_from_pb(
    tenant: str, client_id: str, incarnation: int, p: SubscriptionPb
) -> SubscriptionRecord:
    return SubscriptionRecord(
        tenant,
        client_id,
        incarnation,
        p.topic_filter,
        p.qos,
        p.no_local,
        p.retain_as_published,
        p.retain_handling,
        p.subscription_identifier,
    )
