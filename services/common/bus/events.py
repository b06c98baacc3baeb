"""The messages of the EVENTS stream (`ev.<tenant>.<type>`): one `Event`, or an `EventBatch`
of several events of that tenant and type, and `EventBatcher`, which publishes the events
emitted in one turn of the event loop together.

Why batches: a storm of CONNECTs (a node's devices coming back after it died) emitted one
`connected` event each, and JetStream storing, delivering and taking the acknowledgement of
every one of them cost NATS and the consumers more CPU than the rest of a CONNECT's trip
through the mesh (bench/connects.py: NATS 0.10 of ~0.45 ms per connect). The session service
answers CONNECTs in batches (`ConnectMany`); their events now travel the same way.
"""

from __future__ import annotations

import asyncio
import logging

from google.protobuf.message import DecodeError
from nats.aio.client import Client

from starling.common.v1 import event_pb2

log = logging.getLogger("starling.bus.events")

# Events per EVENTS message: ~150 bytes each, far below NATS's payload limit (1 MiB).
MAX_BATCH = 256


def encode_events(events: list[event_pb2.Event]) -> bytes:
    """One event as an `Event` (what readers before batches expect), several as a batch."""
    if len(events) == 1:
        return events[0].SerializeToString()
    return event_pb2.EventBatch(events=events).SerializeToString()


def decode_events(data: bytes) -> list[event_pb2.Event]:
    """The events of one EVENTS message, in the order emitted; [] for bytes that are neither.
    An `Event` has no field 100, so it reads as an empty batch and is then taken whole."""
    try:
        batch = event_pb2.EventBatch.FromString(data)
        if batch.events:
            return list(batch.events)
        return [event_pb2.Event.FromString(data)]
    except DecodeError:
        return []


class EventBatcher:
    """Publishes events on their subjects, those emitted in one loop turn to one subject in
    one message (at most MAX_BATCH each). Like a plain NATS publish, `emit` does not wait for
    the stream: JetStream stores what reaches it."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._pending: dict[str, list[event_pb2.Event]] = {}
        self._flushing: asyncio.Task[None] | None = None

    def emit(self, subject: str, event: event_pb2.Event) -> None:
        self._pending.setdefault(subject, []).append(event)
        if self._flushing is None:
            self._flushing = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        try:
            while True:
                # One loop turn: the other CONNECTs of a batch reach their events meanwhile.
                await asyncio.sleep(0)
                pending, self._pending = self._pending, {}
                if not pending:
                    return
                for subject, events in pending.items():
                    for i in range(0, len(events), MAX_BATCH):
                        await self._publish(subject, events[i : i + MAX_BATCH])
        finally:  # one task at a time: a subject's events go out in the order emitted
            self._flushing = None

    async def _publish(self, subject: str, events: list[event_pb2.Event]) -> None:
        try:
            await self._nc.publish(subject, encode_events(events))
        except Exception as exc:  # a lost bus: these events are lost, nothing else
            log.warning("event_publish_failed", extra={"error": type(exc).__name__})
