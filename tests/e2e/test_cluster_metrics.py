"""Cluster metrics of a running mesh: a fresh tenant's clients publish known counts at QoS
0, 1 and 2 from both nodes, and the metrics service's figures (admin API) show exactly those
counts per QoS, the bytes, and the busiest topics."""

from __future__ import annotations

import asyncio
import sqlite3
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.metrics.client import MetricsAdminClient, TenantCounters
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.e2e.admin import Admin
from tests.e2e.clients import Paho
from tests.poll import wait_until

PAYLOAD = b"x" * 10


def tenant_stats(mesh: MeshInfo, tenant: str) -> TenantCounters | None:
    async def get() -> TenantCounters | None:
        admin = MetricsAdminClient(mesh.addr("metrics"), ADMIN_TOKEN)
        try:
            totals = await admin.cluster_stats()
        finally:
            await admin.close()
        return next((t for t in totals.tenants if t.tenant == tenant), None)

    return asyncio.run(get())


@pytest.fixture(scope="module")
def traffic(mesh: MeshInfo) -> str:
    """A fresh tenant: a subscriber at QoS 2 on node 1; publishers on both nodes send 7 QoS
    0, 5 QoS 1 and 3 QoS 2 messages each (30 in all), mostly to one topic."""
    tenant = f"m{uuid.uuid4().hex[:8]}"
    Admin(mesh).user(tenant, "u", "pw")
    sub = Paho(mesh.node(1), username=f"{tenant}/u", password="pw")
    sub.connect()
    sub.subscribe("s/#", 2)
    for node in (0, 1):
        pub = Paho(mesh.node(node), username=f"{tenant}/u", password="pw")
        pub.connect()
        for qos, n in ((0, 7), (1, 5), (2, 3)):
            for i in range(n):
                pub.publish("s/hot" if i else f"s/cold{node}{qos}", PAYLOAD, qos)
        pub.close()
    assert len(sub.expect(30)) == 30
    sub.close()
    return tenant


def test_counts_per_qos_match_what_the_clients_did(mesh: MeshInfo, traffic: str) -> None:
    def counted() -> TenantCounters | None:
        t = tenant_stats(mesh, traffic)
        # Every QoS 1/2 publish's ack latency is in too (its ack came after its count in).
        full = t and (t.messages_in, t.messages_out, sum(t.ack_latency_buckets)) == (30, 30, 16)
        return t if full else None

    t = wait_until(counted, 15, "the tenant's 30 messages in and out, 16 acks", every_s=0.1)
    assert (t.msgs_in_q0, t.msgs_in_q1, t.msgs_in_q2) == (14, 10, 6)
    # Delivered at min(publish QoS, subscription QoS 2): the same split.
    assert (t.msgs_out_q0, t.msgs_out_q1, t.msgs_out_q2) == (14, 10, 6)
    # Bytes in and out are message bytes (services/common/message_size.py): topic + payload,
    # the figure the byte quotas limit; no protocol overhead.
    topics = [f"s/cold{n}{q}" for n in (0, 1) for q in (0, 1, 2)]
    topics += ["s/hot" for q, n in ((0, 6), (1, 4), (2, 2)) for _ in range(2 * n)]
    expected = sum(len(topic) + len(PAYLOAD) for topic in topics)
    assert t.bytes_in == expected
    assert t.bytes_out == expected
    assert t.messages_dropped == 0 and t.quota_refusals == 0
    assert 0 < t.ack_latency_sum_s < 16 * 5


def test_the_busiest_topic_is_recorded_for_the_hour(mesh: MeshInfo) -> None:
    from services.connection.top_topics import SAMPLE_EVERY

    # Its own tenant and traffic: one publish in SAMPLE_EVERY is looked at, so the 30 of the
    # shared fixture give each node about two looks, which can all fall on its cold topics.
    # Here one topic in ten is cold, spread out: every run, s/hot has most of the looks.
    tenant = f"m{uuid.uuid4().hex[:8]}"
    Admin(mesh).user(tenant, "u", "pw")
    sent = 200
    pub = Paho(mesh.node(0), username=f"{tenant}/u", password="pw")
    pub.connect()
    for i in range(sent):
        pub.publish(f"s/cold{i}" if i % 10 == 3 else "s/hot", PAYLOAD, 0)
    pub.close()

    def topics() -> dict[str, int]:
        with sqlite3.connect(Path(mesh.mesh.data_dir) / "data" / "usage.db") as db:
            rows = db.execute(
                "SELECT topic, sum(messages) FROM usage_topics WHERE tenant=? GROUP BY topic",
                (tenant,),
            ).fetchall()
        return dict(rows)

    def reported() -> dict[str, int]:
        t = topics()
        return t if abs(sum(t.values()) - sent) <= SAMPLE_EVERY else {}

    # Weighted by SAMPLE_EVERY: about the number sent, once the node's report is in.
    got = wait_until(reported, 15, f"about {sent} messages on the tenant's topics", every_s=0.1)
    assert max(got, key=got.__getitem__) == "s/hot"
    assert got["s/hot"] >= 0.8 * sent - SAMPLE_EVERY


def test_sessions_subscriptions_and_retained_come_from_where_they_are_held(
    mesh: MeshInfo,
) -> None:
    tenant = f"m{uuid.uuid4().hex[:8]}"
    Admin(mesh).user(tenant, "u", "pw")
    away = Paho(mesh.node(0), username=f"{tenant}/u", password="pw")
    away.connect(clean_start=False, session_expiry=300)
    away.subscribe("a/#", 1)
    away.subscribe("b", 1)
    away.close()  # a persistent session, offline, with 2 subscriptions (the router's)
    here = Paho(mesh.node(1), username=f"{tenant}/u", password="pw")
    here.connect()
    here.subscribe("c", 0)  # a transient client's subscription (its node's)
    here.publish("r/1", b"12345", 1, retain=True)

    def held() -> TenantCounters | None:
        t = tenant_stats(mesh, tenant)
        # The closed client may be in a node's report a moment longer: wait for all of it.
        full = (
            t
            and (t.subscriptions, t.retained_messages) == (3, 1)
            and (t.sessions_online, t.sessions_persistent, t.sessions_persistent_online)
            == (1, 1, 0)
        )
        return t if full else None

    what = "3 subscriptions, 1 retained message, 1 online and 1 offline session"
    t = wait_until(held, 15, what, every_s=0.1)
    assert t.retained_bytes > 5
    here.close()


def scrape(mesh: MeshInfo) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The cluster endpoint, fetched over HTTP as curl would: sample -> value."""
    port = mesh.mesh.by_name("metrics").port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_cluster_endpoint_shows_the_counts_per_tenant_and_qos(
    mesh: MeshInfo, traffic: str
) -> None:
    def sample(name: str, **labels: str) -> float | None:
        return got.get((name, frozenset({"tenant": traffic, **labels}.items())))

    def series() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        g = scrape(mesh)
        acks = (
            "starling_cluster_publish_ack_latency_seconds_count",
            frozenset({("tenant", traffic)}),
        )
        return g if g.get(acks) == 16 else {}

    got = wait_until(series, 15, "the tenant's series", every_s=0.1)
    for qos, n in (("0", 14), ("1", 10), ("2", 6)):
        assert sample("starling_cluster_messages_received_total", qos=qos) == n
        assert sample("starling_cluster_messages_sent_total", qos=qos) == n
    # Message bytes (topic + payload) of the 30 publishes, in and out alike.
    assert sample("starling_cluster_bytes_received_total") == 468
    assert sample("starling_cluster_bytes_sent_total") == 468
    assert sample("starling_cluster_messages_dropped_total", cause="slow_consumer") == 0
    assert sample("starling_cluster_quota_refusals_total") == 0
    assert sample("starling_cluster_connections") == 0  # all of them closed
    assert got[("starling_cluster_reporters", frozenset({("kind", "node")}))] == 2


def own_metrics(mesh: MeshInfo, name: str) -> str:
    port = mesh.mesh.by_name(name).metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def red_samples(text: str, metric: str) -> dict[tuple[str, str, str, str], float]:
    return {
        (s.labels["service"], s.labels["method"], s.labels["outcome"], s.labels["transport"]): (
            s.value
        )
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == metric
    }


def test_red_series_appear_after_an_admin_call(mesh: MeshInfo, traffic: str) -> None:
    async def denied() -> None:
        admin = MetricsAdminClient(mesh.addr("metrics"), "wrong-token")
        try:
            await admin.cluster_stats()
        except Exception:  # UNAUTHENTICATED: what the test counts
            pass
        finally:
            await admin.close()

    tenant_stats(mesh, traffic)
    asyncio.run(denied())
    svc = "starling.metrics.v1.MetricsAdminService"

    def red() -> str:
        t = own_metrics(mesh, "metrics")
        errors = red_samples(t, "starling_rpc_errors_total")
        return t if (svc, "GetClusterStats", "UNAUTHENTICATED", "grpc") in errors else ""

    got = wait_until(red, 15, "RED series of the admin call", every_s=0.1)
    requests = red_samples(got, "starling_rpc_requests_total")
    assert requests[(svc, "GetClusterStats", "OK", "grpc")] >= 1
    assert (svc, "GetClusterStats", "OK", "grpc") not in red_samples(
        got, "starling_rpc_errors_total"
    )
    durations = red_samples(got, "starling_rpc_duration_seconds_count")
    assert durations[(svc, "GetClusterStats", "OK", "grpc")] >= 1
    # The router serves the persistent publish path over NATS request/reply.
    nats = red_samples(own_metrics(mesh, "router"), "starling_rpc_requests_total")
    assert any(k[3] == "nats" and k[2] == "OK" for k in nats), nats


def test_the_cluster_endpoint_shows_the_queue_depth_of_an_offline_session(mesh: MeshInfo) -> None:
    """QoS 1 messages for an offline persistent session wait in its queue: the tenant's
    `starling_cluster_queue_depth` counts them, and drops to 0 once the session is back and
    has acknowledged them."""
    n = 12
    tenant = f"m{uuid.uuid4().hex[:8]}"
    Admin(mesh).user(tenant, "u", "pw")

    def depth() -> float | None:
        return scrape(mesh).get(("starling_cluster_queue_depth", frozenset({("tenant", tenant)})))

    away = Paho(mesh.node(0), client_id="away", username=f"{tenant}/u", password="pw")
    away.connect(clean_start=False, session_expiry=300)
    away.subscribe("q/#", 1)
    away.close()
    pub = Paho(mesh.node(1), username=f"{tenant}/u", password="pw")
    pub.connect()
    for i in range(n):
        pub.publish("q/x", b"%d" % i, 1)  # returns at its PUBACK: stored in the queue
    pub.close()
    wait_until(lambda: depth() == n, 15, f"depth {n}", every_s=0.1)
    back = Paho(mesh.node(0), client_id="away", username=f"{tenant}/u", password="pw")
    back.connect(clean_start=False, session_expiry=300)
    assert sorted(int(m.payload) for m in back.expect(n)) == list(range(n))
    wait_until(lambda: depth() == 0, 15, "depth 0 once acknowledged", every_s=0.1)
    back.close()


def test_a_nodes_connection_gauge_reads_0_when_a_tenants_last_client_leaves(
    mesh: MeshInfo,
) -> None:
    # The series used to vanish instead: an alert on `== 0` never fired.
    tenant = f"m{uuid.uuid4().hex[:8]}"
    Admin(mesh).user(tenant, "u", "pw")
    port = mesh.mesh.by_name("connection-0").metrics_port

    def gauge() -> float | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "starling_connections" and s.labels.get("tenant") == tenant:
                    return float(s.value)
        return None

    c = Paho(mesh.node(0), username=f"{tenant}/u", password="pw")
    c.connect()
    wait_until(lambda: gauge() == 1, 15, "one connection", every_s=0.1)
    c.close()
    wait_until(lambda: gauge() == 0, 15, "0 once it left", every_s=0.1)
