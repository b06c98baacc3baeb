"""Client and session events on the EVENTS stream (`ev.<tenant>.<type>`), and the stream
itself (`ensure_stream`)."""

from __future__ import annotations

import dataclasses
import logging

from nats.aio.client import Client
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from services.common.bus import subjects
from services.common.bus.events import EventBatcher
from services.common.clock import now_ms
from starling.common.v1 import event_pb2

log = logging.getLogger("starling.session.events")

EVENTS_MAX_AGE_S = 7 * 24 * 3600


async def ensure_stream(js: JetStreamContext, replicas: int) -> None:
    """Create the EVENTS stream with `replicas`, or bring an existing one to them.

    A mesh moved from one NATS server to a cluster (`nats_stream_replicas` 3) would otherwise
    keep the stream it created alone on one server, whose death then stops the event log and
    the rules on events; JetStream copies an updated stream's messages to the new replicas.
    Only the replica count is changed: the rest of the stream's configuration (an operator
    may have changed its retention) stays as it is."""
    try:
        info = await js.stream_info(subjects.EVENTS_STREAM)
    except NotFoundError:
        # Two instances starting together both create it: JetStream answers the second
        # with the stream when the configuration is the same.
        await js.add_stream(
            name=subjects.EVENTS_STREAM,
            subjects=[subjects.EVENTS_WILDCARD],
            max_age=EVENTS_MAX_AGE_S,
            num_replicas=replicas,
        )
        return
    had = info.config.num_replicas or 1
    if had != replicas:
        await js.update_stream(dataclasses.replace(info.config, num_replicas=replicas))
        log.info("events_stream_replicas_changed", extra={"from": had, "to": replicas})


class Events:
    """Client events on the EVENTS stream (`ev.<tenant>.<type>`), those of one loop turn (a
    `ConnectMany`) in one message per subject (services/common/bus/events.py)."""

    def __init__(self, nc: Client, node_id: str) -> None:
        self._batcher = EventBatcher(nc)
        self._node = node_id

    async def emit(self, tenant: str, client_id: str, kind: str, **detail: object) -> None:
        ev = event_pb2.Event(tenant=tenant, client_id=client_id, node_id=self._node, ts_ms=now_ms())
        if kind == "connected":
            ev.type = event_pb2.EVENT_TYPE_CLIENT_CONNECTED
            ev.connected.CopyFrom(event_pb2.ClientConnected(**detail))  # type: ignore[arg-type]
        elif kind == "disconnected":
            ev.type = event_pb2.EVENT_TYPE_CLIENT_DISCONNECTED
            ev.disconnected.CopyFrom(event_pb2.ClientDisconnected(**detail))  # type: ignore[arg-type]
        elif kind == "taken_over":
            ev.type = event_pb2.EVENT_TYPE_SESSION_TAKEN_OVER
        elif kind == "quota_exceeded":
            ev.type = event_pb2.EVENT_TYPE_QUOTA_EXCEEDED
            ev.quota_exceeded.CopyFrom(event_pb2.QuotaExceeded(**detail))  # type: ignore[arg-type]
        elif kind == "session_expired":
            ev.type = event_pb2.EVENT_TYPE_SESSION_EXPIRED
            ev.session_expired.SetInParent()
        self._batcher.emit(subjects.event(tenant, kind), ev)
