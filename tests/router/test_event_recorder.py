"""The EVENTS stream reaches the event log: a real JetStream stream and durable consumer,
the embedded store; events are acknowledged only once appended."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import nats

from services.common.bus import subjects
from services.common.store.eventlog import STREAM_KINDS, EventKind
from services.common.store.sqlite_session import SqliteSessionStore
from services.session.event_recorder import EventRecorder, log_event
from starling.common.v1 import event_pb2


def test_only_events_of_known_kinds_with_a_tenant_are_kept() -> None:
    ev = event_pb2.Event(tenant="t", client_id="c").SerializeToString()
    row = log_event("ev.t.connected", ev)
    assert row is not None and (row.tenant, row.kind, row.client_id, row.data) == (
        "t",
        EventKind.CONNECTED,
        "c",
        ev,
    )
    assert log_event("ev.t.unknown", ev) is None
    assert log_event("ev.t.connected", b"\xff\xff") is None
    assert log_event("ev.t.connected", event_pb2.Event().SerializeToString()) is None


async def test_stream_events_are_appended_to_the_log(nats_url: str, tmp_path: Path) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        await js.stream_info(subjects.EVENTS_STREAM)
    except Exception:
        await js.add_stream(name=subjects.EVENTS_STREAM, subjects=[subjects.EVENTS_WILDCARD])
    store = SqliteSessionStore(tmp_path / "sessions.db")
    tenant = f"t{uuid.uuid4().hex[:8]}"
    durable = f"eventlog-{tenant}"
    recorder = EventRecorder(nc, store, 50, durable=durable)
    task = asyncio.create_task(recorder.run())
    try:
        for kind, client in (("connected", "a"), ("quota_exceeded", ""), ("disconnected", "a")):
            ev = event_pb2.Event(tenant=tenant, client_id=client)
            await js.publish(subjects.event(tenant, kind), ev.SerializeToString())
        rows = []
        for _ in range(200):
            rows = await store.read_events(0, 100, tenant=tenant, kinds=STREAM_KINDS)
            if len(rows) == 3:
                break
            await asyncio.sleep(0.05)
        assert [(r.kind, r.client_id) for r in rows] == [
            ("connected", "a"),
            ("quota_exceeded", ""),
            ("disconnected", "a"),
        ]
        # Acknowledged once appended: nothing is left pending for the consumer.
        for _ in range(100):
            info = await js.consumer_info(subjects.EVENTS_STREAM, durable)
            if info.num_ack_pending == 0:
                break
            await asyncio.sleep(0.05)
        assert info.num_ack_pending == 0
    finally:
        task.cancel()
        await js.delete_consumer(subjects.EVENTS_STREAM, durable)
        await nc.close()
        await store.close()
