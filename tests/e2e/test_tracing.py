"""A sampled PUBLISH is one trace from the publisher's node to the subscriber's node, and a
CONNECT is one trace from the node into the session service (in-memory span exporter; the
services run in this process so the exporter sees every span)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common.rpc.server import create_server, set_serving, stop_server
from services.connection.config import ConnectionSettings
from services.connection.main import ConnectionService
from services.session.config import SessionSettings
from services.session.main import SessionService
from tests.e2e.clients import Paho
from tests.inproc import inproc_auth

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
async def traced_nodes(
    nats_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[int, int]]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    # Its own session service: the nodes' CONNECTs (NATS) must reach it, not the core's.
    common = {
        "nats_url": nats_url,
        "redis_url": redis_url,
        "metrics_port": -1,
        "session_subject": "svc.session.traced",
    }
    session = SessionService(
        SessionSettings(
            **common,
            data_dir=Path(tmp_path_factory.mktemp("trace")),
            anonymous_tenants=["*"],
            node_id="session-t",
        )
    )
    server, port, health = create_server("127.0.0.1:0", session.register, auth=inproc_auth())
    await server.start()
    await session.start()
    await set_serving(health, [])
    nodes = []
    for i in range(2):
        svc = ConnectionService(
            ConnectionSettings(
                **common,
                node_id=f"trace-node-{i}",
                mqtt_port=0,
                mqtt_host="127.0.0.1",
                session_addr=f"127.0.0.1:{port}",
                trace_sample_ratio=1.0,
            )
        )
        await svc.start()
        nodes.append(svc)
    yield nodes[0].ports["mqtt"], nodes[1].ports["mqtt"]
    for svc in nodes:
        await svc.stop()
    await session.stop()
    await stop_server(server, health, 1)


async def test_publish_is_one_trace_across_nodes(traced_nodes: tuple[int, int]) -> None:
    port0, port1 = traced_nodes
    sub = Paho(port1)
    pub = Paho(port0)
    await asyncio.to_thread(sub.connect)
    await asyncio.to_thread(sub.subscribe, "traced/t", 1)
    await asyncio.to_thread(pub.connect)
    await asyncio.to_thread(pub.publish, "traced/t", "x", 0)
    (msg,) = await asyncio.to_thread(sub.expect, 1)
    assert msg.payload == b"x"
    spans = EXPORTER.get_finished_spans()
    publish = [s for s in spans if s.name == "mqtt.publish"]
    deliver = [s for s in spans if s.name == "mqtt.deliver"]
    assert publish and deliver
    p, d = publish[-1], deliver[-1]
    assert p.context.trace_id == d.context.trace_id
    assert d.parent is not None and d.parent.span_id == p.context.span_id
    assert (p.attributes["starling.node"], d.attributes["starling.node"]) == (
        "trace-node-0",
        "trace-node-1",
    )

    connects = [s for s in spans if s.name == "mqtt.connect"]
    # The session service's side: the gRPC method, or (the nodes' transport) the NATS
    # request it serves (services/common/bus/unary.py, a span named after the subject).
    session_side = [
        s
        for s in spans
        if s.name.endswith("SessionService/Connect") or s.name == "svc.session.traced.connect"
    ]
    assert connects and session_side
    assert {s.context.trace_id for s in connects} & {s.context.trace_id for s in session_side}
    await asyncio.to_thread(sub.close)
    await asyncio.to_thread(pub.close)
