"""The EVENTS stream reaches the event log: a real JetStream stream and durable consumer,
the embedded store; events are acknowledged only once appended."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import nats

from services.common.bus import subjects
from services.common.bus.events import encode_events
from services.common.store.eventlog import STREAM_KINDS, EventKind
from services.common.store.sqlite_session import SqliteSessionStore
from services.session.event_recorder import EventRecorder, log_events
from starling.common.v1 import event_pb2
from tests.poll import eventually


def test_only_events_of_known_kinds_with_a_tenant_are_kept() -> None:
    ev = event_pb2.Event(tenant="t", client_id="c").SerializeToString()
    rows = log_events("ev.t.connected", ev)
    assert [(r.tenant, r.kind, r.client_id, r.data) for r in rows] == [
        ("t", EventKind.CONNECTED, "c", ev)
    ]
    assert log_events("ev.t.unknown", ev) == []
    assert log_events("ev.t.connected", b"\xff\xff") == []
    assert log_events("ev.t.connected", event_pb2.Event().SerializeToString()) == []


def test_a_batch_gives_a_row_per_event_each_as_if_published_alone() -> None:
    events = [
        event_pb2.Event(tenant=t, client_id=c) for t, c in (("t", "a"), ("t", "b"), ("", "c"))
    ]
    data = event_pb2.EventBatch(events=events).SerializeToString()
    rows = log_events("ev.t.connected", data)
    assert [(r.client_id, r.data) for r in rows] == [
        ("a", events[0].SerializeToString()),
        ("b", events[1].SerializeToString()),
    ]  # the one without a tenant is skipped, as alone


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
        batch = [event_pb2.Event(tenant=tenant, client_id=c) for c in ("b", "c")]
        await js.publish(subjects.event(tenant, "connected"), encode_events(batch))

        async def five_rows() -> list[Any]:
            rows = await store.read_events(0, 100, tenant=tenant, kinds=STREAM_KINDS)
            return rows if len(rows) == 5 else []

        rows = await eventually(five_rows, 10, "five events recorded", every_s=0.05)
        assert [(r.kind, r.client_id) for r in rows] == [
            ("connected", "a"),
            ("quota_exceeded", ""),
            ("disconnected", "a"),
            ("connected", "b"),
            ("connected", "c"),
        ]

        async def none_pending() -> bool:
            info = await js.consumer_info(subjects.EVENTS_STREAM, durable)
            return bool(info.num_ack_pending == 0)

        # Acknowledged once appended: nothing is left pending for the consumer.
        await eventually(none_pending, 5, "no acks pending", every_s=0.05)
    finally:
        task.cancel()
        await js.delete_consumer(subjects.EVENTS_STREAM, durable)
        await nc.close()
        await store.close()
