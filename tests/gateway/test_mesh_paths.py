"""An HTTP publish goes where a node's publish goes: to an offline persistent session's
queue (delivered when it comes back), through the rules (republish), and as a delayed
publish through the router."""

from __future__ import annotations

import asyncio
import queue
import uuid

import aiohttp

from services.rules.admin_client import RulesAdminClient
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.e2e.clients import Paho
from tests.gateway.helpers import add_user, bearer, post, subscriber, unique
from tests.poll import eventually

PUBLISH = "/api/v5/publish"


async def test_offline_persistent_session_gets_http_publishes(mesh: MeshInfo) -> None:
    tenant = unique("gwp")
    await add_user(mesh, tenant, "dev", "pw")
    sub = Paho(mesh.node(1), client_id="gw-persistent", username=f"{tenant}/dev", password="pw")
    sub.connect(clean_start=False, session_expiry=300)
    sub.subscribe("gw/offline/#", 1)
    sub.close()
    async with aiohttp.ClientSession(mesh.gateway_http) as http:
        for i in range(10):
            body = {"topic": "gw/offline/t", "payload": f"m{i}", "qos": 1, "tenant": tenant}
            status, answer, _ = await post(http, PUBLISH, body, bearer(ADMIN_TOKEN))
            assert status == 200, answer
    back = Paho(mesh.node(0), client_id="gw-persistent", username=f"{tenant}/dev", password="pw")
    back.connect(clean_start=False, session_expiry=300)
    try:
        got = await asyncio.to_thread(back.expect, 10)
        assert [m.payload.decode() for m in got] == [f"m{i}" for i in range(10)]
    finally:
        back.close(session_expiry=0)


async def test_rules_read_http_publishes(mesh: MeshInfo) -> None:
    """A republish rule of tenant `open` acts on what the gateway publishes."""
    tag = uuid.uuid4().hex[:6]
    rules = RulesAdminClient(mesh.addr("rules"), ADMIN_TOKEN)
    await rules.create(
        "open",
        f"gw-{tag}",
        f'SELECT payload FROM "gwin/{tag}/#"',
        [("republish", {"topic": f"gwout/{tag}", "qos": "1"})],
    )
    sub = subscriber(mesh, 1, f"open/s-{tag}", "x", f"gwout/{tag}")
    try:
        async with aiohttp.ClientSession(mesh.gateway_http) as http:

            async def republished() -> bool:
                # Until the gateway has the rule's filter (pushed after the rule's creation).
                body = {"topic": f"gwin/{tag}/a", "payload": "r", "qos": 1, "tenant": "open"}
                status, answer, _ = await post(http, PUBLISH, body, bearer(ADMIN_TOKEN))
                assert status == 200, answer
                try:
                    return sub.messages.get(timeout=0.3) is not None
                except queue.Empty:
                    return False

            await eventually(republished, 20, "the rule's republished message")
    finally:
        sub.close()
        await rules.delete("open", f"gw-{tag}")
        await rules.close()


async def test_delayed_http_publish(mesh: MeshInfo) -> None:
    tag = uuid.uuid4().hex[:6]
    sub = subscriber(mesh, 0, f"open/d-{tag}", "x", f"gwlater/{tag}")
    try:
        body = {"topic": f"$delayed/1/gwlater/{tag}", "payload": "later", "tenant": "open"}
        async with aiohttp.ClientSession(mesh.gateway_http) as http:
            status, answer, _ = await post(http, PUBLISH, body, bearer(ADMIN_TOKEN))
        assert status == 200, answer
        (m,) = await asyncio.to_thread(sub.expect, 1)
        assert m.topic == f"gwlater/{tag}" and m.payload == b"later"
    finally:
        sub.close()


async def test_a_traced_tenants_http_publish_is_one_trace_to_the_subscriber(
    mesh: MeshInfo,
) -> None:
    """Tenant `traced` is sampled (the test mesh's setting): the gateway opens the publish
    span, and the subscriber's node's delivery span is in the same trace."""
    from tests.e2e.test_trace_files import _trace_of

    topic = f"gwtr/{uuid.uuid4().hex[:8]}"
    sub = subscriber(mesh, 1, "traced/gw-sub", "x", topic)
    try:
        body = {"topic": topic, "payload": "t", "qos": 0, "tenant": "traced"}
        async with aiohttp.ClientSession(mesh.gateway_http) as http:
            status, answer, _ = await post(http, PUBLISH, body, bearer(ADMIN_TOKEN))
        assert status == 200, answer
        await asyncio.to_thread(sub.expect, 1)
        want = {("gateway", "mqtt.publish"), ("connection-1", "mqtt.deliver")}
        await asyncio.to_thread(_trace_of, mesh, topic, want)
    finally:
        sub.close()


async def test_gateway_traffic_is_counted_with_the_tenants(mesh: MeshInfo) -> None:
    """What the gateway took in reaches the cluster's per-tenant figures (`starling stats`)."""
    from services.metrics.client import MetricsAdminClient

    tenant = unique("gwm")
    async with aiohttp.ClientSession(mesh.gateway_http) as http:
        bulk = [{"topic": "m/t", "payload": "abc", "qos": 1, "tenant": tenant}] * 3
        status, answer, _ = await post(http, "/api/v5/publish/bulk", bulk, bearer(ADMIN_TOKEN))
    assert status == 200, answer
    metrics = MetricsAdminClient(mesh.addr("metrics"), ADMIN_TOKEN)
    try:

        async def counted() -> bool:
            stats = await metrics.cluster_stats()
            mine = [t for t in stats.tenants if t.tenant == tenant]
            return bool(mine) and mine[0].messages_in == 3 and mine[0].msgs_in_q1 == 3

        await eventually(counted, 15, "the gateway's report at the metrics service")
    finally:
        await metrics.close()
