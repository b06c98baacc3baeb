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
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services.cli.launcher import Launcher
from services.cli.status import component_status
from services.common.mqtt import (
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)
from services.common.mqtt.reason import ReasonCode as RC
from services.common.rpc.server import check_health
from services.common.runtime import LIVENESS
from services.connection.client import ConnectionAdminClient, DrainProgress
from tests.e2e.clients import Flooder, Paho, Raw
from tests.faults.checker import Checker
from tests.faults.load import Publisher as FaultPublisher
from tests.poll import wait_until

RATE = 20  # connections closed per second while draining
A, B = "connection-0", "connection-1"
STARLING = [sys.executable, "-m", "services.cli.main"]


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    folder = tmp_path_factory.mktemp("drain")
    launcher = Launcher(
        folder / "run",
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


def _port(launcher: Launcher, node: str) -> int:
    return launcher.mesh.by_name(node).port


def _drain(launcher: Launcher, node: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STARLING, "drain", node, "--data-dir", launcher.mesh.data_dir, *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def _ask_drain(launcher: Launcher, node: str, reference: str) -> DrainProgress:
    comp = launcher.mesh.by_name(node)
    client = ConnectionAdminClient(f"127.0.0.1:{comp.grpc_port}", launcher.admin_token)
    try:
        return await client.drain(reference)
    finally:
        await client.close()


def _raw(port: int, tenant: str, client_id: str, level: int, **kw: object) -> Raw:
    raw = Raw(port, level=level)
    ack = raw.connect(Connect(client_id, level, username=f"{tenant}/u", **kw))  # type: ignore[arg-type]
    assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
    return raw


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


@dataclass
class Watched:
    """What the server sent on each socket until it closed it, and when it closed it."""

    data: dict[socket.socket, bytearray] = field(default_factory=dict)
    closed_at: dict[socket.socket, float] = field(default_factory=dict)


def _watch(socks: list[socket.socket], timeout_s: float) -> tuple[threading.Thread, Watched]:
    """Read every socket in a thread until the server closes it (recording when)."""
    seen = Watched({s: bytearray() for s in socks})

    def run() -> None:
        sel = selectors.DefaultSelector()
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while len(seen.closed_at) < len(socks) and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.2):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    chunk = s.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if chunk:
                    seen.data[s] += chunk
                else:
                    seen.closed_at[s] = time.monotonic()
                    sel.unregister(s)
        sel.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, seen


class Publisher(threading.Thread):
    """Publishes QoS 1 messages one at a time (the next once the last was acknowledged);
    told 0x9C it goes where the Server Reference says and sends the unacknowledged
    message again. `acked`: the numbers of the acknowledged messages."""

    def __init__(self, port: int, tenant: str) -> None:
        super().__init__(daemon=True)
        self.port, self.tenant = port, tenant
        self.acked: list[int] = []
        self.references: list[str] = []
        self.ports: list[int] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def _connect(self, port: int) -> Raw:
        self.ports.append(port)
        return _raw(port, self.tenant, "publisher", 5)

    def run(self) -> None:
        try:
            raw, n, pid = self._connect(self.port), 0, 0
            while not self.stop.is_set():
                pid = pid % 65535 + 1
                raw.send(Publish(f"load/{n}", str(n).encode(), 1, packet_id=pid))
                reply = raw.recv()
                if isinstance(reply, PubAck) and reply.packet_id == pid:
                    assert reply.reason_code == 0, reply
                    self.acked.append(n)
                    n += 1
                    continue
                assert isinstance(reply, Disconnect), reply
                assert reply.reason_code == RC.USE_ANOTHER_SERVER
                ref = reply.properties.server_reference or ""
                self.references.append(ref)
                raw.close()
                raw = self._connect(int(ref.split()[0].rsplit(":", 1)[1]))
            raw.send(Disconnect())
            raw.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


def _payloads(*clients: Paho) -> set[int]:
    got: set[int] = set()
    for c in clients:
        while not c.messages.empty():
            got.add(int(c.messages.get_nowait().payload))
    return got


def test_drain_sends_clients_elsewhere_at_the_rate_and_loses_no_acknowledged_message(
    launcher: Launcher,
) -> None:
    tenant = f"d{uuid.uuid4().hex[:8]}"
    port_a, port_b = _port(launcher, A), _port(launcher, B)
    elsewhere = f"127.0.0.1:{port_b}"
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
    watcher, seen = _watch([r.sock for r in v5 + v3], timeout_s=60)

    pub = Publisher(port_a, tenant)
    pub.start()
    wait_until(lambda: len(pub.acked) >= 50 or pub.error, 20)
    assert pub.error is None, pub.error

    first = _drain(launcher, A)
    assert first.returncode == 0, first.stderr
    reply = json.loads(first.stdout)
    assert reply["started"] is True and reply["node_id"] == A
    assert reply["server_reference"] == elsewhere  # the other node, from `starling up`
    # Asking again (a retried or restarted coordinator) starts nothing new: it reports.
    again = asyncio.run(_ask_drain(launcher, A, "elsewhere.example:1883"))
    assert again.started is False and again.server_reference == elsewhere
    assert 0 < again.connections <= len(v5) + len(v3) + 3

    # Load balancers move away: health NOT_SERVING while the clients are being closed.
    state = wait_until(
        lambda: (s := component_status(launcher.mesh.by_name(A))) != "SERVING" and s, 20
    )
    assert state == "NOT_SERVING"
    # ... but alive: a liveness probe must not kill the process mid-drain.
    grpc_a = f"127.0.0.1:{launcher.mesh.by_name(A).grpc_port}"
    assert asyncio.run(check_health(grpc_a, service=LIVENESS)) in ("SERVING", "UNREACHABLE")
    assert wait_until(lambda: _refused(port_a), 20)  # new connections are refused

    # The process exits once empty (status 0: a drain is a normal end).
    assert launcher.procs[A].wait(timeout=60) == 0
    watcher.join(timeout=30)
    assert len(seen.closed_at) == len(v5) + len(v3), "every drained client was closed"
    for r in v5:
        [bye] = Decoder(5).feed(bytes(seen.data[r.sock]))
        assert isinstance(bye, Disconnect) and bye.reason_code == RC.USE_ANOTHER_SERVER
        assert bye.properties.server_reference == elsewhere
    for r in v3:
        assert seen.data[r.sock] == b""  # 3.1.1: closed, nothing sent
    # Paced: n closes at RATE per second take at least (n - 1) / RATE (a lower bound only,
    # which no slowness can break; the drained node also held the sessions and publisher).
    times = sorted(seen.closed_at.values())
    assert times[-1] - times[0] >= 0.9 * (len(times) - 1) / RATE
    v3_times = sorted(seen.closed_at[r.sock] for r in v3)
    assert v3_times[-1] - v3_times[0] >= 0.9 * (len(v3) - 1) / RATE

    # The publisher followed the reference and goes on acknowledged on connection-1.
    at_drain = len(pub.acked)
    wait_until(lambda: len(pub.acked) >= at_drain + 50 or pub.error, 20)
    pub.stop.set()
    pub.join(timeout=20)
    assert pub.error is None, pub.error
    assert pub.references and set(pub.references) == {elsewhere}
    assert pub.ports[-1] == port_b
    acked = set(pub.acked)

    # The persistent sessions resume on connection-1 with every acknowledged message.
    for old in (s3, s5):
        old.c.loop_stop()  # no reconnecting to the drained node
    s3b = Paho(port_b, "keep-v3", v5=False, username=f"{tenant}/u", clean=False)
    s3b.connect()
    s5b = Paho(port_b, "keep-v5", username=f"{tenant}/u")
    s5b.connect(clean_start=False, session_expiry=300)
    assert s3b.session_present and s5b.session_present
    got3: set[int] = set()
    got5: set[int] = set()

    def complete() -> bool:
        got3.update(_payloads(s3, s3b))
        got5.update(_payloads(s5, s5b))
        return acked <= got3 and acked <= got5

    try:
        wait_until(complete, 20)
    except AssertionError:
        pass  # reported below with what is missing
    missing3, missing5 = acked - got3, acked - got5
    assert not missing3 and not missing5, (len(acked), sorted(missing3)[:5], sorted(missing5)[:5])
    # A drain is a server-side close without DISCONNECT 0x00: the will is published.
    [w] = wills.expect(1)
    assert (w.topic, w.payload) == ("wills/v3", b"gone")
    for c in (s3b, s5b, wills):
        c.close()


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
