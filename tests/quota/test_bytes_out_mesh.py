"""The outbound bandwidth limit (max_bytes_out_per_s) on the two-node mesh with real clients
(issue 16): a QoS 0 subscriber of a publisher sending 5x its tenant's limit receives about
the limit, the rest counted dropped (starling_limit_refusals_total{limit="bytes_out_per_s"}),
while another tenant's subscriber gets everything; a persistent QoS 1 subscriber gets every
message, only slower, also across a reconnect while it is held back."""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections import Counter

from services.quota.client import Limits
from tests.conftest import MeshInfo
from tests.e2e.clients import Paho
from tests.poll import holds_within, wait_until
from tests.quota.test_quota_mesh import PASSWORD, quota, refusals_metric, tenant_with_user

LIMIT = 20_000  # bytes out per second
PAYLOAD = 1000  # + the topic: each delivery is charged ~1 kB


def _publish_flat(pub: Paho, topic: str, per_s: int, seconds: float) -> int:
    """QoS 0 at `per_s` messages a second (paced per 10 ms) for `seconds`; the count sent."""
    sent, start = 0, time.time()
    while (elapsed := time.time() - start) < seconds:
        while sent < elapsed * per_s:
            pub.c.publish(topic, b"%06d" % sent + b"x" * (PAYLOAD - 6), 0)
            sent += 1
        time.sleep(0.01)  # pacing a load generator, not waiting for a result
    return sent


def _drain(sub: Paho, until: float) -> list[tuple[float, bytes]]:
    """What arrives until `until` (what already arrived, at least)."""
    got = []
    while True:
        try:
            wait = until - time.time()
            m = sub.messages.get(timeout=wait) if wait > 0 else sub.messages.get_nowait()
        except queue.Empty:
            return got
        got.append((time.time(), m.payload))


def test_qos0_over_the_outbound_limit_is_dropped_and_another_tenant_is_unaffected(
    mesh: MeshInfo,
) -> None:
    tenant, user = tenant_with_user(mesh, Limits(max_bytes_out_per_s=LIMIT))
    sub = Paho(mesh.node(1), username=user, password=PASSWORD)
    got: list[tuple[float, bytes]] = []  # arrival times, as they arrive
    sub.c.on_message = lambda c, u, m: got.append((time.time(), m.payload))
    sub.connect()
    sub.subscribe("bw/x", 0)
    calm = Paho(mesh.node(1))  # tenant "default": no limits
    calm.connect()
    calm.subscribe("bwcalm/x", 0)
    pub = Paho(mesh.node(0), username=user, password=PASSWORD)
    pub.connect()
    other = Paho(mesh.node(0))
    other.connect()
    # 100 kB/s (5x the limit) to each subscriber for 4 s.
    flood = threading.Thread(target=_publish_flat, args=(other, "bwcalm/x", 100, 4.0))
    flood.start()
    start = time.time()
    sent = _publish_flat(pub, "bw/x", 100, 4.0)
    flood.join(10)
    calm_got = _drain(calm, time.time() + 1.0)
    # Whole one-second windows once leases flow (the quota service's windows are wall-clock
    # seconds): about the limit each, within the documented tolerance.
    first, last = int(start) + 1, int(start) + 4
    per_s = Counter(int(t) for t, _ in got if first <= int(t) < last)
    rate = sum(per_s.values()) * (PAYLOAD + len("bw/x")) / (last - first)
    assert 0.7 * LIMIT <= rate <= 1.2 * LIMIT, (rate, per_s)
    assert len(got) < sent / 2  # far less than was published
    # The rest was dropped and counted as refusals of bytes_out_per_s on the subscriber's node.
    refused = refusals_metric(mesh, "connection-1", tenant, "bytes_out_per_s")
    assert refused >= (sent - len(got)) * 0.9, (refused, sent, len(got))
    # Another tenant's subscriber on the same node got (nearly) everything, far over 20 kB/s.
    assert len(calm_got) >= 0.95 * 400, len(calm_got)
    for c in (sub, calm, pub, other):
        c.close()


def test_a_persistent_qos1_subscriber_gets_every_message_just_slower(mesh: MeshInfo) -> None:
    _, user = tenant_with_user(mesh, Limits(max_bytes_out_per_s=LIMIT))
    client_id = f"bw-{uuid.uuid4().hex[:8]}"
    sub = Paho(mesh.node(1), client_id=client_id, username=user, password=PASSWORD)
    sub.connect(session_expiry=300)
    sub.subscribe("bwq/x", 1)
    pub = Paho(mesh.node(0), username=user, password=PASSWORD)
    pub.connect()
    n = 80  # 80 kB: four seconds' worth of the limit
    start = time.time()
    for i in range(n):
        rc = pub.publish("bwq/x", b"%06d" % i + b"x" * (PAYLOAD - 6), 1)
        assert rc is not None and not rc.is_failure
    # Held back: after a second far from everything arrived. Then the subscriber's connection
    # drops while entries are held in its queue, and it comes back on the other node.
    first = _drain(sub, start + 1.5)
    # 1.5 s touches at most three of the cluster's one-second windows (the rest of one, a
    # whole one, the start of the next): three windows' grants, a message of debt in each
    # and the one that goes before a node knows the limit. Without the limit all 80 arrive.
    held_to = 3 * (LIMIT // PAYLOAD + 1) + 1
    assert len(first) <= held_to < n, len(first)
    sub.c.loop_stop()
    sub.c.socket().close()  # no DISCONNECT: the connection just dies
    first += _drain(sub, time.time())  # what arrived (and paho acked) meanwhile
    sub2 = Paho(mesh.node(0), client_id=client_id, username=user, password=PASSWORD)
    sub2.connect(clean_start=False, session_expiry=300)
    rest: list[tuple[float, bytes]] = []
    seen = {p[:6] for _, p in first}

    def all_seen() -> bool:
        rest.extend(_drain(sub2, time.time() + 0.5))
        seen.update(p[:6] for _, p in rest)
        return len(seen) >= n

    holds_within(all_seen, 20, every_s=0)  # settling: the assert below names what is missing
    assert seen == {b"%06d" % i for i in range(n)}  # every acknowledged message, none lost
    # Slower: 80 kB at 20 kB/s takes at least two more whole windows after the first.
    assert rest and rest[-1][0] - start >= 2.0
    pub.close()
    sub2.close(session_expiry=0)


def test_the_outbound_limit_set_and_lifted_at_runtime_applies_to_connected_clients(
    mesh: MeshInfo,
) -> None:
    """A subscriber connected while its tenant had no outbound limit (its node then skips
    the check per delivery) is held to the limit once it is set, and gets everything again
    once it is lifted: no reconnect, no restart."""
    tenant, user = tenant_with_user(mesh, Limits())
    sub = Paho(mesh.node(1), username=user, password=PASSWORD)
    sub.connect()
    sub.subscribe("bwrt/x", 0)
    pub = Paho(mesh.node(0), username=user, password=PASSWORD)
    pub.connect()

    def burst(n: int) -> int:
        """`n` QoS 0 publishes of ~1 kB at once; how many the subscriber got (the burst's
        last one arrives before the drain ends, or it was dropped)."""
        tag = uuid.uuid4().hex[:6].encode()
        for i in range(n):
            pub.c.publish("bwrt/x", tag + b"%06d" % i + b"x" * (PAYLOAD - 12), 0)
        got = _drain(sub, time.time() + 0.7)
        return sum(1 for _, p in got if p.startswith(tag))

    assert burst(100) == 100  # no limit: 100 kB at once, all of it
    quota(mesh, lambda c: c.set_limits(tenant, Limits(max_bytes_out_per_s=LIMIT)))
    # One 0.7 s drain touches at most two one-second windows: two grants and a message of
    # debt in each.
    bound = 2 * (LIMIT // PAYLOAD + 1) + 1
    last = [100]

    def held_to(at_most: int) -> bool:
        last[0] = burst(100)
        return last[0] <= at_most

    # The change reaches the node within ms; a burst under way when it lands is partly
    # unlimited, so the bound is checked on the bursts after it.
    wait_until(lambda: held_to(bound), 5, lambda: f"a burst held to {bound}: {last}", 0)
    got = burst(100)
    assert got <= bound, got  # and it stays applied
    assert refusals_metric(mesh, "connection-1", tenant, "bytes_out_per_s") >= 100 - got
    quota(mesh, lambda c: c.set_limits(tenant, Limits()))
    # Lifted: everything again, on the same connection.
    wait_until(lambda: burst(100) == 100, 5, "a whole burst once the limit was lifted", 0)
    for c in (sub, pub):
        c.close()
