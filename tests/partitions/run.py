"""One partition case under load: `run_case` starts the load through HAProxy, cuts, waits for
the mesh's reaction, holds the partition, heals, waits until the mesh is back (every
component serving, both nodes in HAProxy's pool, a fresh publish reaching a subscriber on
each node), settles the load and returns what happened as `Outcome`; the figures also go to
`FIGURES` (printed at the end of the run by conftest.py, and appended as JSON lines to the
file STARLING_PARTITION_FIGURES names, if set).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import paho.mqtt.client as mqtt

from services.common.rpc.credentials import MESH_METADATA_KEY
from starling.session.v1 import session_pb2
from starling.session.v1 import session_pb2_grpc as session_grpc
from tests.faults.checker import Verdict
from tests.partitions.cluster import NODES, Cluster
from tests.partitions.load import Balancer, PartitionLoad, TwoNodesWatch, WatchReport
from tests.poll import wait_until

FIGURES: list[dict[str, Any]] = []

# Waits for the reaction to a cut: the load, where each client was (name -> node), when the
# cut began (monotonic); returns the reaction's figure, as the docs' table shows it.
React = Callable[[PartitionLoad, dict[str, str], float], str]


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    cut: Callable[[], None]
    heal: Callable[[], None]
    react: React
    hold_s: float  # the partition lasts at least this long
    # More figures once the load settled (a note for the table, as "note").
    after: Callable[[], dict[str, Any]] = lambda: {}


@dataclass(frozen=True, slots=True)
class Outcome:
    verdict: Verdict
    watch: WatchReport
    placement: dict[str, str]  # client name -> node, before the cut
    unacked: dict[str, int]  # publishes never acknowledged, per publisher
    figures: dict[str, Any]


def placement(load: PartitionLoad, lb: Balancer) -> dict[str, str]:
    """Client name -> the node its open connection goes to (through HAProxy)."""
    names = {cl.name: cl for cl in load.clients}
    by_id = {
        (cl.client_id if hasattr(cl, "client_id") else cl.c._client_id.decode()): name
        for name, cl in names.items()
    }
    ports = load.local_ports()
    return {by_id[ports[p]]: node for p, node in lb.sessions() if p in ports}


def mesh_back(c: Cluster, lb: Balancer, timeout_s: float = 90.0) -> None:
    """Every component serves, both nodes are in the pool, a publish reaches both nodes."""
    wait_until(lambda: not c.dead() and not c.not_serving(), timeout_s, "every component serving")
    wait_until(lambda: lb.up() == set(NODES), timeout_s, "both nodes back in HAProxy's pool")
    wait_until(lambda: round_trip(c.lb_port, lb), timeout_s, "a round trip through each node")


def round_trip(lb_port: int, lb: Balancer) -> bool:
    """A clean subscriber on each node (through HAProxy), one QoS 1 publish: both get it."""
    topic = f"probe/{uuid.uuid4().hex[:8]}"
    subs: list[mqtt.Client] = []
    got: dict[int, threading.Event] = {}
    subscribed: dict[int, threading.Event] = {}
    try:
        for i in range(6):  # round robin: connections alternate between the nodes
            sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
            got[i], subscribed[i] = threading.Event(), threading.Event()
            sub.on_message = lambda c, u, m, e=got[i]: e.set()
            sub.on_subscribe = lambda c, u, mid, rc, p, e=subscribed[i]: e.set()
            sub.connect("127.0.0.1", lb_port, keepalive=10)
            sub.loop_start()
            subs.append(sub)
            sub.subscribe(topic, 1)
            nodes = {n for p, n in lb.sessions() if p in _local_ports(subs)}
            if nodes == set(NODES):
                break
        else:
            return False
        if not all(subscribed[i].wait(5) for i in range(len(subs))):
            return False
        time.sleep(0.3)  # SUBACK sent, the node's NATS interest reaches the other node
        pub = subs[0]
        pub.publish(topic, b"probe", qos=1).wait_for_publish(5)
        return all(got[i].wait(5) for i in range(len(subs)))
    except (OSError, RuntimeError, ValueError):
        return False
    finally:
        for s in subs:
            hang_up(s)


def fresh_connect(lb_port: int, lb: Balancer, timeout_s: float = 10.0) -> str:
    """What a new client sees: a clean MQTT 5 CONNECT through HAProxy, its CONNACK's reason,
    how long it took and which node answered (or that none came in `timeout_s`)."""
    done = threading.Event()
    result: list[str] = []

    def on_connect(c: Any, u: Any, flags: Any, rc: Any, p: Any) -> None:
        sock = c.socket()
        port = sock.getsockname()[1] if sock is not None else 0
        node = dict(lb.sessions()).get(port, "?")
        result.append(f"{rc} from {node}")
        done.set()

    cl = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    cl.on_connect = on_connect
    cl.on_disconnect = lambda c, u, f, rc, p: done.set()
    started = time.monotonic()
    try:
        cl.connect("127.0.0.1", lb_port, keepalive=10)
        cl.loop_start()
        done.wait(timeout_s)
    except OSError as exc:
        return f"new CONNECT: {exc}"
    finally:
        hang_up(cl)
    if not result:
        return f"new CONNECT: no CONNACK in {timeout_s:.0f} s"
    return f"new CONNECT: CONNACK {result[0]} in {time.monotonic() - started:.1f} s"


def hang_up(cl: mqtt.Client) -> None:
    """DISCONNECT, and the socket closed for sure: `disconnect()` then `loop_stop()` can
    stop paho's thread before it wrote the packet, leaving the connection open on the node
    until the object is collected."""
    sock = cl.socket()
    cl.disconnect()
    cl.loop_stop()
    if sock is not None:
        sock.close()


def _local_ports(clients: list[mqtt.Client]) -> set[int]:
    out = set()
    for cl in clients:
        sock = cl.socket()
        if sock is not None:
            out.add(sock.getsockname()[1])
    return out


def registry_misses(c: Cluster, load: PartitionLoad, lb: Balancer) -> list[str]:
    """Clients connected (HAProxy's sessions) that the session registry does not list at
    the node they are on (ListClients over the session admin API)."""
    meta = (
        ("authorization", f"Bearer {c.secrets.admin_token}"),
        (MESH_METADATA_KEY, c.secrets.mesh_secret),
    )
    with grpc.insecure_channel(c.procs["session"].grpc) as ch:
        stub = session_grpc.SessionAdminServiceStub(ch)
        r = stub.ListClients(session_pb2.ListClientsRequest(tenant="default"), metadata=meta)
    listed = {(i.client_id, i.node_id) for i in r.clients}
    ports = load.local_ports()
    held = {(ports[p], node) for p, node in lb.sessions() if p in ports}
    return sorted(f"{cid}@{node}" for cid, node in held - listed)


def run_case(c: Cluster, case: Case) -> Outcome:
    lb = Balancer(c.folder / "haproxy.sock")
    load = PartitionLoad(c.lb_port)
    nodes = {n: c.procs[n].grpc for n in NODES}
    watch = TwoNodesWatch(load, lb, nodes, c.secrets.admin_token, c.secrets.mesh_secret)
    try:
        load.start()
        wait_until(lambda: load.checker.delivered_count("persistent-q2a") >= 100, 30, "load")
        where = placement(load, lb)
        watch.start()
        cut_at = time.monotonic()
        case.cut()
        try:
            reaction = case.react(load, where, cut_at)
            time.sleep(max(0.0, case.hold_s - (time.monotonic() - cut_at)))  # the scenario
        finally:
            case.heal()
        healed_at = time.monotonic()
        with load.probing():
            mesh_back(c, lb)
        back_s = round(time.monotonic() - healed_at, 1)
        time.sleep(2.0)  # load on the healed mesh
        misses = registry_misses(c, load, lb)
        report = watch.stop()  # before the publishers stop: the gaps are while they publish
        verdict = load.finish()
    except BaseException:
        load.close()
        watch.stop()
        raise
    unacked = {p.name: p.unacked() for p in load.publishers if p.unacked()}
    figures = {
        "case": case.name,
        **verdict.summary(),
        **_watched(report),
        "reaction": reaction,
        "partition_s": round(healed_at - cut_at, 1),
        "back_s": back_s,
        "placement": where,
        "reconnects": {k: v - 1 for k, v in load.connects().items()},
        "server_disconnects": load.server_disconnects(),
        "refused": {p.name: p.refused for p in load.publishers if p.refused},
        "unacked": unacked,
        "registry_misses": misses,
        **case.after(),
    }
    record(figures)
    return Outcome(verdict, report, where, unacked, figures)


def _watched(report: WatchReport) -> dict[str, Any]:
    """The sampler's figures: breaches and the longest stalls the clients saw."""
    gaps = report.delivery_gap_s
    return {
        "two_nodes": len(report.two_nodes),
        "node_count_excess": len(report.excess),
        "samples": report.samples,
        "max_ack_gap_s": max(report.ack_gap_s.values(), default=0.0),
        "max_persistent_gap_s": max(
            (v for k, v in gaps.items() if k.startswith("persistent")), default=0.0
        ),
        "max_clean_gap_s": max((v for k, v in gaps.items() if k.startswith("clean")), default=0.0),
        "ack_gap_s": report.ack_gap_s,
        "delivery_gap_s": gaps,
    }


def record(figures: dict[str, Any]) -> None:
    FIGURES.append(figures)
    print(f"\n{figures['case']}: {json.dumps(figures, default=str)}")
    out = os.environ.get("STARLING_PARTITION_FIGURES")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(figures, default=str) + "\n")


def check(outcome: Outcome) -> None:
    """The suite's promise, for every case: nothing acknowledged lost to a persistent
    session, no QoS 2 duplicate, persistent sessions in order, every publish acknowledged in
    the end, no client id on two nodes at once. Clean sessions' losses are counted only."""
    outcome.verdict.check(clean_may_lose=True)
    assert not outcome.unacked, f"publishes never acknowledged: {outcome.unacked}"
    assert not outcome.watch.two_nodes, f"on two nodes at once: {outcome.watch.two_nodes[:5]}"
    assert not outcome.watch.excess, f"nodes hold more connections: {outcome.watch.excess[:5]}"


def table_lines(figures: list[dict[str, Any]]) -> list[str]:
    """The partition suite's figures as a Markdown table."""
    lines = [
        "| case | sent | acked | lost (persistent) | QoS 2 duplicates | QoS 1 duplicates "
        "| clean lost | two nodes at once | longest PUBACK gap | longest gap persistent / clean "
        "| reaction | back after heal | connected, not in the registry, after heal |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        lines.append(
            f"| {f['case']} | {f['sent']} | {f['acked']} | {f['lost']} | {f['qos2_duplicates']} "
            f"| {f['qos1_duplicates']} | {f['clean_lost']} | {f['two_nodes']} "
            f"| {f['max_ack_gap_s']} s | {f['max_persistent_gap_s']} s / {f['max_clean_gap_s']} s "
            f"| {f['reaction']}{'; ' + f['note'] if 'note' in f else ''} | {f['back_s']} s "
            f"| {len(f['registry_misses'])} |"
        )
    return lines
