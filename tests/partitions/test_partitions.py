"""Partitions of the multi-host test mesh, each under QoS 1 and QoS 2 load to persistent and
clean sessions through HAProxy, each healed before the next (one mesh for all: it must come
back without a restart). The promise checked by every case (tests/partitions/run.py
`check`): nothing acknowledged lost to a persistent session, no QoS 2 duplicate, no client id
on two nodes at once. Figures: docs/failure-behaviour.md, "Partitions (multi-host test
mesh)".
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable

import grpc
import paho.mqtt.client as mqtt
import pytest
import redis

from starling.session.v1 import session_pb2
from starling.session.v1 import session_pb2_grpc as session_grpc
from tests.partitions.cluster import (
    MONITOR_PORT,
    NATS_HOSTS,
    NATS_PORT,
    REDIS_PORT,
    ROUTE_PORT,
    Cluster,
)
from tests.partitions.load import Balancer, PartitionLoad
from tests.partitions.run import Case, React, check, fresh_connect, hang_up, run_case
from tests.poll import wait_until

pytestmark = [pytest.mark.partitions, pytest.mark.timed]
PARTITIONS = 64  # queue_partitions' default


def moved_off(c: Cluster, node: str, timeout_s: float, moved: list[bool]) -> React:
    """Reaction: every client that was on `node` connected again (elsewhere, or on `node`
    once healed); the seconds that took (the slowest client). `moved` gets whether they did
    within `timeout_s` of the cut (the partition lasts that long at least); if they did
    not, what two new clients see (round robin: one on each node)."""

    def react(load: PartitionLoad, where: dict[str, str], cut_at: float) -> str:
        before = load.connects()
        theirs = [name for name, n in where.items() if n == node]
        assert theirs, f"no client on {node}: {where}"
        try:
            wait_until(
                lambda: all(load.connects()[n] > before[n] for n in theirs),
                timeout_s,
                f"the clients of {node} ({theirs}) reconnecting",
                every_s=0.1,
            )
        except AssertionError:
            moved.append(False)
            lb = Balancer(c.folder / "haproxy.sock")
            with load.probing():
                probes = "; ".join(fresh_connect(c.lb_port, lb) for _ in range(2))  # 2 nodes
            return f"{len(theirs)} clients of {node} not told in {timeout_s:.0f} s; {probes}"
        moved.append(True)
        return f"{len(theirs)} clients moved in {time.monotonic() - cut_at:.1f} s"

    return react


@pytest.mark.timeout(300)
def test_node_host_cut_off_from_nats_and_redis(part_mesh: Cluster) -> None:
    """node-0 loses NATS and Redis but not its clients: nothing acknowledged is lost, no
    client is on two nodes at once; its heartbeats go unanswered, so it fences itself
    (services/connection/lease.py): its clients are told (DISCONNECT 0x9C) and reconnect
    through HAProxy to node-1 within the partition."""
    c, net = part_mesh, part_mesh.net
    moved: list[bool] = []
    outcome = run_case(
        c,
        Case(
            name="node host cut off from NATS and Redis",
            cut=lambda: net.block("node-0", [*NATS_HOSTS, "redis"], [NATS_PORT, REDIS_PORT]),
            heal=lambda: net.unblock("node-0"),
            react=moved_off(c, "node-0", 20.0, moved),
            hold_s=20.0,
        ),
    )
    check(outcome)
    assert moved[0], f"the clients of node-0 were not told: {outcome.figures['reaction']}"


def lease_owners(c: Cluster) -> dict[str, str]:
    """Partition lease key -> owning instance, from Redis."""
    r = redis.Redis(
        host=c.address("redis"),
        port=REDIS_PORT,
        password=c.secrets.redis_password,
        decode_responses=True,
    )
    try:
        keys: list[str] = r.keys("starling:queue:lease:*")  # type: ignore[assignment]
        values: list[str | None] = r.mget(keys) if keys else []  # type: ignore[assignment]
        return {k: v or "" for k, v in zip(keys, values, strict=True)}
    finally:
        r.close()


def all_at(c: Cluster, instance: str) -> dict[str, str]:
    """Every partition's lease, if `instance` holds them all; else {}."""
    owners = lease_owners(c)
    if len(owners) == PARTITIONS and all(instance in v for v in owners.values()):
        return owners
    return {}


def all_at_queue_0(c: Cluster) -> React:
    """Reaction: queue-0 holds every partition's lease; after how long."""

    def react(load: PartitionLoad, where: dict[str, str], cut_at: float) -> str:
        owners = wait_until(lambda: all_at(c, "queue-0"), 30.0, "queue-0 holding every lease")
        return f"{len(owners)} partitions at queue-0 after {time.monotonic() - cut_at:.1f} s"

    return react


def queue_case(c: Cluster, name: str, cut: Callable[[], None], heal: Callable[[], None]) -> None:
    """queue-1 cut off: its partitions move to queue-0 under load; what the old owner tried
    to write after the move was refused by the store's epoch (`partition_fenced`)."""
    assert any("queue-1" in v for v in lease_owners(c).values()), "queue-1 owns nothing"
    before = c.events("queue-1", "partition_fenced")

    def fenced() -> dict[str, object]:
        n = c.events("queue-1", "partition_fenced") - before
        return {"old_owner_fenced": n, "note": f"old owner's writes refused by the fence: {n}"}

    outcome = run_case(c, Case(name, cut, heal, all_at_queue_0(c), hold_s=10.0, after=fenced))
    check(outcome)
    # Healed, the two instances share the partitions again.
    wait_until(
        lambda: any("queue-1" in v for v in lease_owners(c).values()),
        30.0,
        "queue-1 holding partitions again",
    )


@pytest.mark.timeout(300)
def test_queue_host_cut_off(part_mesh: Cluster) -> None:
    """queue-1's host loses its link (NATS, Redis, the nodes' queue links, everything)."""
    net = part_mesh.net
    queue_case(
        part_mesh,
        "queue instance host cut off",
        lambda: net.cut("queue-1"),
        lambda: net.heal("queue-1"),
    )


@pytest.mark.timeout(300)
def test_queue_instance_cut_off_from_redis(part_mesh: Cluster) -> None:
    """queue-1 loses Redis only: it keeps NATS and the nodes' queue links, so callers may
    still reach it after queue-0 took its leases; the store's fence refuses its writes."""
    net = part_mesh.net
    queue_case(
        part_mesh,
        "queue instance cut off from Redis (keeps NATS and links)",
        lambda: net.block("queue-1", ["redis"], [REDIS_PORT]),
        lambda: net.unblock("queue-1"),
    )


def nats_server_of(c: Cluster, client: str) -> str:
    """The NATS server (host) that holds the connection named `client`."""
    for host in NATS_HOSTS:
        url = f"http://{c.address(host)}:{MONITOR_PORT}/connz?limit=1024"
        with urllib.request.urlopen(url, timeout=2) as r:
            conns = json.load(r).get("connections", [])
        if any(conn.get("name") == client for conn in conns):
            return host
    raise AssertionError(f"{client} is connected to no NATS server")


def probe_new_client(c: Cluster, after_s: float) -> React:
    """Reaction: what a client connecting `after_s` into the partition sees."""

    def react(load: PartitionLoad, where: dict[str, str], cut_at: float) -> str:
        time.sleep(after_s)  # the scenario: a client arriving during the partition
        with load.probing():
            return fresh_connect(c.lb_port, Balancer(c.folder / "haproxy.sock"))

    return react


@pytest.mark.timeout(300)
def test_nats_cluster_split_two_one(part_mesh: Cluster) -> None:
    """The NATS server node-0 is connected to loses its routes to the other two (every
    client still reaches all three): node-0 and whatever else is on that server are the
    minority side."""
    c, net = part_mesh, part_mesh.net
    lonely = nats_server_of(c, "node-0")
    others = [h for h in NATS_HOSTS if h != lonely]
    outcome = run_case(
        c,
        Case(
            name="NATS cluster split 2/1",
            cut=lambda: net.block(lonely, others, [ROUTE_PORT]),
            heal=lambda: net.unblock(lonely),
            react=probe_new_client(c, 5.0),
            hold_s=15.0,
            after=lambda: {"note": f"node-0's server {lonely} alone"},
        ),
    )
    check(outcome)


@pytest.mark.timeout(300)
def test_redis_unreachable_30s(part_mesh: Cluster) -> None:
    """Redis's host loses its link for 30 s."""
    c, net = part_mesh, part_mesh.net
    outcome = run_case(
        c,
        Case(
            name="Redis unreachable for 30 s",
            cut=lambda: net.cut("redis"),
            heal=lambda: net.heal("redis"),
            react=probe_new_client(c, 5.0),
            hold_s=30.0,
        ),
    )
    check(outcome)


def test_nodes_see_the_clients_address_through_haproxy(part_mesh: Cluster) -> None:
    """The harness itself: HAProxy's pool holds both nodes, and a node takes a client's own
    address from the PROXY v2 header (127.0.0.1 and its port), not HAProxy's."""
    c = part_mesh
    lb = Balancer(c.folder / "haproxy.sock")
    assert lb.up() == {"node-0", "node-1"}
    cl = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, "proxied-1", protocol=mqtt.MQTTv5)
    cl.connect("127.0.0.1", c.lb_port, keepalive=10)
    cl.loop_start()
    try:
        port = cl.socket().getsockname()[1]
        seen = wait_until(lambda: peer_of(c, "proxied-1"), 10.0, "proxied-1 in the registry")
        assert seen == f"127.0.0.1:{port}"
    finally:
        hang_up(cl)


def peer_of(c: Cluster, client_id: str) -> str:
    """The client's address as the session registry has it ("" if not listed)."""
    meta = (("authorization", f"Bearer {c.secrets.admin_token}"),)
    with grpc.insecure_channel(c.procs["session"].grpc) as ch:
        stub = session_grpc.SessionAdminServiceStub(ch)
        r = stub.ListClients(session_pb2.ListClientsRequest(tenant="default"), metadata=meta)
    return next((i.peer_address for i in r.clients if i.client_id == client_id), "")
