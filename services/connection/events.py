"""Client events a connection node emits itself (issue 17): `subscribed` and `unsubscribed`
on the EVENTS stream (`ev.<tenant>.<kind>`), for rules reading `$events/session_subscribed` or
`$events/session_unsubscribed`. Only for tenants with such a rule (the rules service tells
nodes which, services/rules/client.py): other tenants' SUBSCRIBEs cost nothing here. Like the
session service's events, they are published without waiting (the stream stores them), those
of one loop turn in one message per subject (services/common/bus/events.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from nats.aio.client import Client

from services.common.bus import subjects
from services.common.bus.events import EventBatcher
from services.common.clock import now_ms
from services.common.connect import IdentifiedSubscription
from starling.common.v1 import event_pb2


class SubscriptionEvents:
    def __init__(self, nc: Client, node_id: str, wanted: Callable[[str, str], bool]) -> None:
        self._batcher = EventBatcher(nc)
        self._node = node_id
        self._wanted = wanted  # (tenant, kind) -> whether a rule reads it

    def subscribed(
        self,
        tenant: str,
        client_id: str,
        username: str,
        subs: Sequence[IdentifiedSubscription],
        auto: bool,
    ) -> None:
        if not self._wanted(tenant, "subscribed"):
            return
        for s, _ in subs:
            ev = self._event(tenant, client_id, event_pb2.EVENT_TYPE_SUBSCRIBED)
            ev.subscribed.CopyFrom(
                event_pb2.Subscribed(topic_filter=s.filter, qos=s.qos, username=username, auto=auto)
            )
            self._batcher.emit(subjects.event(tenant, "subscribed"), ev)

    def unsubscribed(
        self, tenant: str, client_id: str, username: str, filters: Sequence[str]
    ) -> None:
        if not self._wanted(tenant, "unsubscribed"):
            return
        for f in filters:
            ev = self._event(tenant, client_id, event_pb2.EVENT_TYPE_UNSUBSCRIBED)
            ev.unsubscribed.CopyFrom(event_pb2.Unsubscribed(topic_filter=f, username=username))
            self._batcher.emit(subjects.event(tenant, "unsubscribed"), ev)

    def _event(self, tenant: str, client_id: str, kind: int) -> event_pb2.Event:
        return event_pb2.Event(
            tenant=tenant,
            client_id=client_id,
            node_id=self._node,
            ts_ms=now_ms(),
            type=kind,  # type: ignore[arg-type]
        )
