"""`starling drain NODE` on a mesh of its own (two nodes; the shared `mesh` is never drained).

The first test drains connection-0 under load: MQTT 5 clients get DISCONNECT 0x9C naming the
other node, MQTT 3.1.1 clients are closed no faster than `drain_rate_per_s` (20 here, so the
pacing is visible), new connections are refused, a publisher that follows the Server
Reference and two persistent sessions that resume on connection-1 lose no acknowledged
message, a will of a drained 3.1.1 client is published, and the process exits. The others
check that the node, not the CLI, owns the drain: a killed CLI changes nothing, a node
killed while draining comes back serving.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.cli.launcher import Launcher
from services.cli.status import component_status
from services.common.mqtt import (
    Decoder,
    Disconnect,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)
from services.common.mqtt.reason import ReasonCode as RC
from services.common.rpc.server import check_health
from services.common.runtime import LIVENESS
from tests.e2e.clients import Flooder, Paho, Raw
from tests.e2e.drain_helpers import (
    RATE,
    STARLING,
    A,
    B,
    Publisher,
    Watched,
    _ask_drain,
    _drain,
    _payloads,
    _port,
    _raw,
    _refused,
    _watch,
)
from tests.faults.checker import Checker
from tests.faults.load import Publisher as FaultPublisher
from tests.poll import wait_until


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    folder = tmp_path_factory.mktemp("drain")
    launcher = Launcher(
        data_dir=folder / "run",
        nodes=2,
        mqtt_port=0,
        anonymous=True,
        ws=False,
        extra_env={"STARLING_DRAIN_RATE_PER_S": str(RATE), "STARLING_NODE_TIMEOUT_S": "3"},
    )
    launcher.start(timeout_s=60)
    try:
        yield launcher
    finally:
        launcher.stop()


@dataclass(frozen=True, slots=True)
class OnTheDrainedNode:
    """The clients of the first test: persistent sessions `s3` (3.1.1) and `s5` on the node to
    drain, a will watcher on the other, and clean clients to drain (`v3`'s last has a will)."""

    s3: Paho
    s5: Paho
    wills: Paho
    v5: list[Raw]
    v3: list[Raw]


def _clients_to_drain(port_a: int, port_b: int, tenant: str) -> OnTheDrainedNode:
    # Persistent sessions on the node to drain, one per protocol level.
    s3 = Paho(port_a, "keep-v3", v5=False, username=f"{tenant}/u", clean=False)
    s3.connect()
    s5 = Paho(port_a, "keep-v5", username=f"{tenant}/u")
    s5.connect(clean_start=False, session_expiry=300)
    for s in (s3, s5):
        s.subscribe("load/#", 1)
    # A will watcher on the other node, and a 3.1.1 client with a will on the drained one.
    wills = Paho(port_b, "will-watch", username=f"{tenant}/u")
    wills.connect()
    wills.subscribe("wills/#", 1)
    # Clean clients to drain: 8 MQTT 5, 24 MQTT 3.1.1 (one with a will).
    v5 = [_raw(port_a, tenant, f"v5-{i}", 5) for i in range(8)]
    v3 = [_raw(port_a, tenant, f"v3-{i}", 4) for i in range(23)]
    v3.append(_raw(port_a, tenant, "v3-will", 4, will=Will("wills/v3", b"gone", 1)))
    return OnTheDrainedNode(s3=s3, s5=s5, wills=wills, v5=v5, v3=v3)


def _start_drain(launcher: Launcher, elsewhere: str, clients: int) -> None:
    """The CLI starts the drain; asking again (a retried or restarted coordinator) starts
    nothing new: it reports."""
    first = _drain(launcher, A)
    assert first.returncode == 0, first.stderr
    reply = json.loads(first.stdout)
    assert reply["started"] is True and reply["node_id"] == A
    assert reply["server_reference"] == elsewhere  # the other node, from `starling up`
    again = asyncio.run(_ask_drain(launcher, A, "elsewhere.example:1883"))
    assert again.started is False and again.server_reference == elsewhere
    assert 0 < again.connections <= clients + 3


def _check_the_node_steps_aside(launcher: Launcher, port_a: int) -> None:
    # Load balancers move away: health NOT_SERVING while the clients are being closed.
    state = wait_until(
        lambda: (s := component_status(launcher.mesh.by_name(A))) != "SERVING" and s, 20
    )
    assert state == "NOT_SERVING"
    # ... but alive: a liveness probe must not kill the process mid-drain.
    grpc_a = f"127.0.0.1:{launcher.mesh.by_name(A).grpc_port}"
    assert asyncio.run(check_health(grpc_a, service=LIVENESS)) in ("SERVING", "UNREACHABLE")
    assert wait_until(lambda: _refused(port_a), 20)  # new connections are refused


def _check_closes(seen: Watched, on: OnTheDrainedNode, elsewhere: str) -> None:
    """MQTT 5 clients read 0x9C naming the other node, 3.1.1 ones are closed, at the rate."""
    assert len(seen.closed_at) == len(on.v5) + len(on.v3), "every drained client was closed"
    for r in on.v5:
        [bye] = Decoder(5).feed(bytes(seen.data[r.sock]))
        assert isinstance(bye, Disconnect) and bye.reason_code == RC.USE_ANOTHER_SERVER
        assert bye.properties.server_reference == elsewhere
    for r in on.v3:
        assert seen.data[r.sock] == b""  # 3.1.1: closed, nothing sent
    # Paced: n closes at RATE per second take at least (n - 1) / RATE (a lower bound only,
    # which no slowness can break; the drained node also held the sessions and publisher).
    times = sorted(seen.closed_at.values())
    assert times[-1] - times[0] >= 0.9 * (len(times) - 1) / RATE
    v3_times = sorted(seen.closed_at[r.sock] for r in on.v3)
    assert v3_times[-1] - v3_times[0] >= 0.9 * (len(on.v3) - 1) / RATE


def _publisher_moved(pub: Publisher, elsewhere: str, port_b: int) -> set[int]:
    """The publisher followed the reference and goes on acknowledged on connection-1; the
    numbers of its acknowledged messages."""
    at_drain = len(pub.acked)
    wait_until(lambda: len(pub.acked) >= at_drain + 50 or pub.error, 20)
    pub.stop.set()
    pub.join(timeout=20)
    assert pub.error is None, pub.error
    assert pub.references and set(pub.references) == {elsewhere}
    assert pub.ports[-1] == port_b
    return set(pub.acked)


def _check_sessions_resume(on: OnTheDrainedNode, port_b: int, tenant: str, acked: set[int]) -> None:
    """The persistent sessions resume on connection-1 with every acknowledged message."""
    for old in (on.s3, on.s5):
        old.c.loop_stop()  # no reconnecting to the drained node
    s3b = Paho(port_b, "keep-v3", v5=False, username=f"{tenant}/u", clean=False)
    s3b.connect()
    s5b = Paho(port_b, "keep-v5", username=f"{tenant}/u")
    s5b.connect(clean_start=False, session_expiry=300)
    assert s3b.session_present and s5b.session_present
    got3: set[int] = set()
    got5: set[int] = set()

    def complete() -> bool:
        got3.update(_payloads(on.s3, s3b))
        got5.update(_payloads(on.s5, s5b))
        return acked <= got3 and acked <= got5

    try:
        wait_until(complete, 20)
    except AssertionError:
        pass  # reported below with what is missing
    missing3, missing5 = acked - got3, acked - got5
    assert not missing3 and not missing5, (len(acked), sorted(missing3)[:5], sorted(missing5)[:5])
    s3b.close()
    s5b.close()


def test_drain_sends_clients_elsewhere_at_the_rate_and_loses_no_acknowledged_message(
    launcher: Launcher,
) -> None:
    tenant = f"d{uuid.uuid4().hex[:8]}"
    port_a, port_b = _port(launcher, A), _port(launcher, B)
    elsewhere = f"127.0.0.1:{port_b}"
    on = _clients_to_drain(port_a, port_b, tenant)
    watcher, seen = _watch([r.sock for r in on.v5 + on.v3], timeout_s=60)
    pub = Publisher(port_a, tenant)
    pub.start()
    wait_until(lambda: len(pub.acked) >= 50 or pub.error, 20)
    assert pub.error is None, pub.error

    _start_drain(launcher, elsewhere, len(on.v5) + len(on.v3))
    _check_the_node_steps_aside(launcher, port_a)
    # The process exits once empty (status 0: a drain is a normal end).
    assert launcher.procs[A].wait(timeout=60) == 0
    watcher.join(timeout=30)
    _check_closes(seen, on, elsewhere)
    acked = _publisher_moved(pub, elsewhere, port_b)
    _check_sessions_resume(on, port_b, tenant, acked)
    # A drain is a server-side close without DISCONNECT 0x00: the will is published.
    [w] = on.wills.expect(1)
    assert (w.topic, w.payload) == ("wills/v3", b"gone")
    on.wills.close()


def test_restarted_after_a_drain_the_node_serves_again(launcher: Launcher) -> None:
    """The drain lives in the node's memory: started again, it is not drained."""
    launcher.restart(A)
    port_a = _port(launcher, A)
    raw = _raw(port_a, "again", "back", 5)
    raw.close()
    assert component_status(launcher.mesh.by_name(A)) == "SERVING"


def test_a_drain_outlives_the_cli_that_asked_for_it(launcher: Launcher) -> None:
    port_a = _port(launcher, A)
    clients = [_raw(port_a, "cli", f"c{i}", 4) for i in range(30)]  # 1.5 s of draining
    cli = subprocess.Popen(
        [*STARLING, "drain", A, "--data-dir", launcher.mesh.data_dir, "--wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: component_status(launcher.mesh.by_name(A)) != "SERVING", 20)
        cli.send_signal(signal.SIGKILL)  # the coordinator dies mid-drain
    finally:
        cli.wait()
    assert launcher.procs[A].wait(timeout=60) == 0  # the node finished on its own
    for c in clients:
        assert c.closed()
    launcher.restart(A)


def test_a_node_killed_while_draining_comes_back_serving(launcher: Launcher) -> None:
    port_b = _port(launcher, B)
    clients = [_raw(port_b, "killed", f"c{i}", 4) for i in range(60)]  # 3 s of draining
    assert _drain(launcher, B).returncode == 0
    wait_until(lambda: component_status(launcher.mesh.by_name(B)) != "SERVING", 20)
    launcher.kill(B)
    for c in clients:
        c.close()
    launcher.restart(B)  # returns once it serves
    raw = _raw(port_b, "killed", "after", 5)
    raw.close()


def test_drain_refuses_a_bad_reference_and_an_unknown_node(launcher: Launcher) -> None:
    bad = _drain(launcher, B, "--server-reference", "a\nb")
    assert bad.returncode == 1
    assert "INVALID_ARGUMENT" in bad.stdout and "server_reference" in bad.stdout
    assert component_status(launcher.mesh.by_name(B)) == "SERVING"  # nothing began
    unknown = _drain(launcher, "connection-9")
    assert unknown.returncode == 2 and "connection-9" in unknown.stdout
    not_a_node = _drain(launcher, "router")
    assert not_a_node.returncode == 2 and "not a connection node" in not_a_node.stdout


def test_drain_needs_the_operator_token(launcher: Launcher, tmp_path: Path) -> None:
    wrong = tmp_path / "token"
    wrong.write_text("not-the-token\n")
    env = {k: v for k, v in os.environ.items() if k != "STARLING_ADMIN_TOKEN"}
    out = subprocess.run(
        [*STARLING, "drain", B, "--data-dir", launcher.mesh.data_dir, "--token-file", str(wrong)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 1 and "UNAUTHENTICATED" in out.stdout, out.stdout
    assert component_status(launcher.mesh.by_name(B)) == "SERVING"


def _serving(launcher: Launcher, node: str) -> int:
    """`node`'s MQTT port, started again first if an earlier test left it drained."""
    if launcher.procs[node].poll() is not None:
        launcher.restart(node)
    return _port(launcher, node)


def _echo_flooder(port: int, client_id: str, level: int) -> Flooder:
    """A client that floods a topic it is subscribed to (so it gets as much as it writes,
    and reads less than it gets)."""
    raw = _raw(port, "flood", client_id, level)
    topic = f"flood/{client_id}"
    raw.send(Subscribe(1, (Subscription(topic, 0),)))
    assert isinstance(raw.recv(), SubAck)
    return Flooder.over(raw, topic)


def test_clients_busy_writing_read_their_drain_disconnect(launcher: Launcher) -> None:
    """The node closes lingering (services/connection/linger.py): MQTT 5 clients flooding
    while their node drains read DISCONNECT 0x9C and its Server Reference; a 3.1.1 one sees
    the end of the connection, not a reset."""
    port_a, port_b = _serving(launcher, A), _port(launcher, B)
    v5 = [_echo_flooder(port_a, f"flood5-{i}", 5) for i in range(3)]
    v3 = _echo_flooder(port_a, "flood3", 4)
    for f in (*v5, v3):
        f.start()
    for f in (*v5, v3):
        f.flooding()  # the node has unread input from every one of them from now on
    assert _drain(launcher, A).returncode == 0
    for f in (*v5, v3):
        assert f.done.wait(20), "still flooding: the node did not close it"
    for f in v5:
        assert f.ended == "disconnect", f"no DISCONNECT read: {f.ended}"
        assert f.disconnect is not None
        assert f.disconnect.reason_code == RC.USE_ANOTHER_SERVER
        assert f.disconnect.properties.server_reference == f"127.0.0.1:{port_b}"
    assert v3.ended == "eof", v3.ended
    assert launcher.procs[A].wait(timeout=60) == 0
    launcher.restart(A)


def test_a_qos2_exchange_under_way_in_a_drain_is_completed(launcher: Launcher) -> None:
    """QoS 2 publishers (persistent sessions) keep PUBRELs in flight while their node
    drains; they follow the Server Reference and send again what had no answer. The node
    wrote no PUBREL's release without its PUBCOMP: none gets PUBCOMP 0x92 (Packet
    Identifier not found) on the next node, and every exchange completes."""
    port_a, port_b = _serving(launcher, A), _port(launcher, B)
    checker = Checker()
    pubs = [
        FaultPublisher(f"q2-{i}", lambda: [port_a, port_b], 0, 2, f"q2/{i}", checker, rate=300)
        for i in range(3)
    ]
    for p in pubs:
        p.start()
    wait_until(lambda: all(checker.acked_by(p.name) >= 100 for p in pubs), 20)
    assert _drain(launcher, A).returncode == 0
    wait_until(lambda: all(p.connects >= 2 and p.connected.is_set() for p in pubs), 20)
    for p in pubs:
        p.pause()
    wait_until(lambda: all(p.unacked() == 0 for p in pubs), 20)
    for p in pubs:
        p.stop()
    for p in pubs:
        assert p.server_disconnects == [(RC.USE_ANOTHER_SERVER, f"127.0.0.1:{port_b}")]
        assert p.sessions_lost == 0
        assert p.refusals == [], p.refusals
        assert checker.acked_by(p.name) == p.seq  # every exchange completed
    assert launcher.procs[A].wait(timeout=60) == 0
    launcher.restart(A)
