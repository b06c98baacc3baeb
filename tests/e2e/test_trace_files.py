"""A persistent QoS 1 message followed across the mesh's processes by its trace: the
publishing node, the queue (and the router when the node asked it), the subscriber's node,
one trace id. The mesh samples only tenant "traced" (per-tenant sampling) and its processes
write their spans to <data dir>/traces/<process>.jsonl (the local mesh's exporter)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MeshInfo
from tests.e2e.clients import Paho
from tests.poll import wait_until


def _spans(mesh: MeshInfo) -> list[dict[str, Any]]:
    out = []
    for f in (Path(mesh.mesh.data_dir) / "traces").glob("*.jsonl"):
        # Only whole lines: the exporter may be writing the last one as we read.
        for line in f.read_text().split("\n")[:-1]:
            if line.strip():
                span = json.loads(line)
                span["process"] = f.stem
                out.append(span)
    return out


def _kind(span: dict[str, Any]) -> str:
    """The span's name; a delivery from a persistent session's queue is told apart from the
    transient fan-out's span of the same name (spans leave in separate batches)."""
    if span["name"] == "mqtt.deliver" and "starling.queue" in span["attributes"]:
        return "mqtt.deliver from queue"
    return str(span["name"])


def _trace_of(mesh: MeshInfo, topic: str, want: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """The spans of the trace whose publish span has `topic`, once every (process, span
    name) of `want` is among them (spans are exported in batches every 200 ms)."""

    def complete() -> list[dict[str, Any]]:
        spans = _spans(mesh)
        roots = [
            s
            for s in spans
            if s["name"] == "mqtt.publish" and s["attributes"].get("mqtt.topic") == topic
        ]
        if roots:
            trace_id = roots[0]["context"]["trace_id"]
            found = [s for s in spans if s["context"]["trace_id"] == trace_id]
            if want <= {(s["process"], _kind(s)) for s in found}:
                return found
        return []

    return wait_until(complete, 10, f"a complete trace for {topic}", every_s=0.1)


@pytest.mark.parametrize("retain", [False, True], ids=["from-route-copy", "through-router"])
def test_a_persistent_message_is_one_trace_from_publisher_node_to_subscriber_node(
    mesh: MeshInfo, retain: bool
) -> None:
    # A retained publish always goes through the router (it stores retained messages); any
    # other goes from the node's copy of the route table to the queue, once that is loaded.
    topic = f"tr/{uuid.uuid4().hex[:8]}"
    cid = f"tr-{uuid.uuid4().hex[:8]}"
    sub = Paho(mesh.node(1), client_id=cid, username="traced/sub", clean=False)
    sub.connect(clean_start=False, session_expiry=300)
    sub.subscribe(topic, 1)
    pub = Paho(mesh.node(0), username="traced/pub")
    pub.connect()
    assert pub.publish(topic, "followed", 1, retain=retain) is not None
    assert sub.expect(1)[0].payload == b"followed"
    want = {
        ("connection-0", "mqtt.publish"),
        ("queue", "queue.append"),
        ("connection-1", "mqtt.deliver from queue"),
    }
    spans = _trace_of(mesh, topic, want | ({("router", "router.route")} if retain else set()))
    by_name = {(s["process"], s["name"]): s for s in spans}
    publish = by_name[("connection-0", "mqtt.publish")]
    append = by_name[("queue", "queue.append")]
    # The subscriber node's delivery from the session's queue (its transient fan-out may
    # open a span of the same name, which sends a persistent session nothing).
    (deliver,) = [
        s
        for s in spans
        if s["process"] == "connection-1"
        and s["name"] == "mqtt.deliver"
        and "starling.queue" in s["attributes"]
    ]
    # Every hop is a child of the publish span: the envelope carries that context to the
    # queue (and to the router, when the node asked the router rather than its copy of the
    # route table) and is stored with the entry for the subscriber's node.
    hops = [append, deliver] + [s for s in spans if s["name"] == "router.route"]
    assert {s["parent_id"] for s in hops} == {publish["context"]["span_id"]}
    assert append["attributes"]["starling.append_result"] == "APPEND_RESULT_OK"
    assert deliver["attributes"]["mqtt.client_id"] == cid
    assert deliver["attributes"]["mqtt.dup"] is False
    if retain:
        pub.publish(topic, "", 1, retain=True)  # clear it
    sub.close(session_expiry=0)
    pub.close()


def test_only_the_sampled_tenant_is_traced(mesh: MeshInfo) -> None:
    topic = f"tr/{uuid.uuid4().hex[:8]}"
    sub = Paho(mesh.node(1))  # tenant "default": sampling ratio 0
    sub.connect()
    sub.subscribe(topic, 1)
    pub = Paho(mesh.node(0))
    pub.connect()
    traced_topic = f"tr/{uuid.uuid4().hex[:8]}"
    traced = Paho(mesh.node(0), username="traced/pub")
    traced.connect()
    pub.publish(topic, "not followed", 1)
    assert sub.expect(1)[0].payload == b"not followed"
    traced.publish(traced_topic, "followed", 1)
    _trace_of(mesh, traced_topic, {("connection-0", "mqtt.publish")})  # exported by now
    assert not [s for s in _spans(mesh) if s["attributes"].get("mqtt.topic") == topic]
    for c in (sub, pub, traced):
        c.close()
