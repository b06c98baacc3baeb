"""Records the EVENTS stream (`ev.<tenant>.<type>`: connections, take-overs, expiries, quota
refusals, queue drops) in the store's event log, for the data pipeline.

A durable JetStream pull consumer shared by every session service instance: each event is
taken by one instance, appended in a batch, and acknowledged only after the append committed.
At least once: an instance that dies between the two leaves the batch to be delivered again
(the row's `data` is the Event as published, so a reader can tell a repeat by its content).
Subscription changes are not taken from here: the router's store writes log them with the
subscription rows themselves (services/common/store/eventlog.py).
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client
from nats.errors import TimeoutError as NatsTimeout

from services.common.bus import subjects
from services.common.bus.events import decode_events
from services.common.store.eventlog import STREAM_KINDS, EventLog, LogEvent

log = logging.getLogger("starling.session.events")
DURABLE = "eventlog"
RETRY_S = 1.0  # after a failed append or fetch, before trying again


def log_events(subject: str, data: bytes) -> list[LogEvent]:
    """The log rows of one EVENTS message (an event or a batch of them); none for one that
    is not an event (or of a kind the log does not keep). Each row's `data` is its Event
    alone, as it would have been published on its own."""
    kind = subject.rsplit(".", 1)[-1]
    if kind not in STREAM_KINDS:
        return []
    # Only Starling's services publish here (NATS permissions): bytes that are not an event
    # are skipped, not retried. Serializing is deterministic: a repeat has the same bytes.
    return [
        LogEvent(ev.tenant, kind, ev.client_id, data=ev.SerializeToString())
        for ev in decode_events(data)
        if ev.tenant
    ]


class EventRecorder:
    def __init__(self, nc: Client, store: EventLog, batch: int, durable: str = DURABLE) -> None:
        self._nc = nc
        self._store = store
        self._batch = batch
        self._durable = durable
        self.recorded = 0  # events appended (for tests and metrics)

    async def run(self) -> None:
        js = self._nc.jetstream()
        while True:  # a task of its own: it must outlast a JetStream that cannot answer yet
            try:
                sub = await js.pull_subscribe(
                    subjects.EVENTS_WILDCARD, self._durable, stream=subjects.EVENTS_STREAM
                )
                break
            except Exception as exc:
                log.warning("event_consumer_unavailable", extra={"error": repr(exc)})
                await asyncio.sleep(RETRY_S)
        while True:
            try:
                msgs = await sub.fetch(self._batch, timeout=1.0)
            except (TimeoutError, NatsTimeout):
                continue
            except Exception as exc:
                log.warning("event_fetch_failed", extra={"error": repr(exc)})
                await asyncio.sleep(RETRY_S)
                continue
            events = [e for m in msgs for e in log_events(m.subject, m.data)]
            try:
                await self._store.append_events(events)
            except Exception as exc:  # not acked: JetStream delivers them again
                log.warning("event_log_append_failed", extra={"error": repr(exc)})
                await asyncio.sleep(RETRY_S)
                continue
            self.recorded += len(events)
            for m in msgs:
                await m.ack()
