"""Client and session events on the EVENTS stream (`ev.<tenant>.<type>`)."""

from __future__ import annotations

import time

from nats.aio.client import Client

from services.common.bus import subjects
from starling.common.v1 import event_pb2


class Events:
    """Client events on the EVENTS stream (`ev.<tenant>.<type>`)."""

    def __init__(self, nc: Client, node_id: str) -> None:
        self._nc = nc
        self._node = node_id

    async def emit(self, tenant: str, client_id: str, kind: str, **detail: object) -> None:
        ev = event_pb2.Event(
            tenant=tenant, client_id=client_id, node_id=self._node, ts_ms=int(time.time() * 1000)
        )
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
        await self._nc.publish(subjects.event(tenant, kind), ev.SerializeToString())
