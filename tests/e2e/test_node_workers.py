"""`--node-workers`: one node run as two processes behind the same ports (SO_REUSEPORT).

The mesh here is the tests' own (one node, two workers: `connection-0` and
`connection-0-w1`); one test kills a worker. Which worker a connection lands on is the
kernel's choice, made from the connection's addresses and ports: `_source_port_on` finds a
local port that lands on the wanted worker, so a test can put a client on either one.
"""

from __future__ import annotations

import socket
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from services.cli.launcher import Launcher
from services.cli.ports import free_port
from services.common.mqtt import ConnAck, Connect, Disconnect
from services.common.mqtt.reason import ReasonCode as RC
from starling.session.v1 import session_pb2 as pb
from starling.session.v1 import session_pb2_grpc as pb_grpc
from tests.cli.in_process import starling_in_process
from tests.e2e.clients import Paho, Raw
from tests.poll import wait_until

WORKERS = ("connection-0", "connection-0-w1")


@dataclass
class Workers:
    launcher: Launcher
    port: int
    ws_port: int
    admin: pb_grpc.SessionAdminServiceStub
    token: str

    def clients(self, tenant: str) -> dict[str, str]:
        """client id -> node id of every client connected in `tenant`."""
        reply = self.admin.ListClients(
            pb.ListClientsRequest(tenant=tenant),
            metadata=[("authorization", f"Bearer {self.token}")],
        )
        return {c.client_id: c.node_id for c in reply.clients}


def _listed(w: Workers, tenant: str, n: int) -> dict[str, str]:
    """`w.clients(tenant)` once it lists `n` clients."""
    found: dict[str, str] = {}

    def enough() -> bool:
        found.clear()
        found.update(w.clients(tenant))
        return len(found) >= n

    wait_until(enough)
    return found


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    folder = tmp_path_factory.mktemp("node-workers")
    launcher = Launcher(
        data_dir=folder / "run",
        nodes=1,
        mqtt_port=0,
        anonymous=True,
        node_workers=2,
        extra_env={"STARLING_LOG_LEVEL": "INFO", "STARLING_NODE_TIMEOUT_S": "3"},
    )
    launcher.start(timeout_s=60)
    try:
        first = launcher.mesh.by_name(WORKERS[0])
        session = launcher.mesh.by_name("session").grpc_port
        admin = pb_grpc.SessionAdminServiceStub(grpc.insecure_channel(f"127.0.0.1:{session}"))
        yield Workers(launcher, first.port, first.ws_port, admin, launcher.admin_token)
    finally:
        launcher.stop()


def _tenant() -> str:
    return f"w{uuid.uuid4().hex[:8]}"


def _raw(w: Workers, tenant: str, client_id: str, source_port: int = 0, level: int = 4) -> Raw:
    raw = Raw(w.port, level=level, source_port=source_port)
    ack = raw.connect(Connect(client_id, level, username=f"{tenant}/u"))
    assert isinstance(ack, ConnAck) and ack.reason_code == 0, ack
    return raw


def _reset(raw: Raw) -> None:
    """Close with a reset: no TIME_WAIT is left, so the local port can be bound again."""
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    raw.close()


def _source_port_on(w: Workers, worker: str) -> int:
    """A local port whose connections to the node's MQTT port the kernel hands to `worker`
    (it picks a listener from a hash of the addresses and ports): a probe connects from
    it, the registry tells where it landed, and the probe is reset so the port is free
    again for the client that needs it. Ports come from `free_port`, below the ephemeral
    range: an ephemeral one may be held by other connections (TIME_WAIT to elsewhere),
    and then cannot be bound."""
    tenant = _tenant()
    for _ in range(64):
        cid = f"probe-{uuid.uuid4().hex[:8]}"
        port = free_port()
        probe = _raw(w, tenant, cid, source_port=port)
        node = wait_until(lambda c=cid: w.clients(tenant).get(c))  # type: ignore[misc]
        _reset(probe)
        if node == worker:
            return port
    raise AssertionError(f"no connection landed on {worker}")


def test_workers_share_the_node_ports_and_clients_land_on_both(workers: Workers) -> None:
    mesh = workers.launcher.mesh
    a, b = (mesh.by_name(n) for n in WORKERS)
    assert (a.port, a.ws_port) == (b.port, b.ws_port)
    assert a.pid != b.pid
    tenant = _tenant()
    raws = [_raw(workers, tenant, f"tcp-{i}") for i in range(24)]
    where = _listed(workers, tenant, 24)
    # 24 connections all on one of two listeners: 1 in 2**23 if the kernel spreads them.
    assert set(where.values()) == set(WORKERS)
    # WebSocket clients (slower to open) until both workers have one: 1 in 2**31 to fail.
    ws: list[Paho] = []
    seen: set[str] = set()
    while seen != set(WORKERS) and len(ws) < 32:
        c = Paho(workers.ws_port, f"ws-{len(ws)}", username=f"{tenant}/u", transport="websockets")
        c.connect()
        ws.append(c)
        cid = c.client_id
        seen.add(wait_until(lambda cid=cid: workers.clients(tenant).get(cid)))  # type: ignore[misc]
    assert seen == set(WORKERS), f"{len(ws)} WebSocket clients, all on {seen}"
    for r in raws:
        r.close()
    for c in ws:
        c.close()


def test_qos0_and_qos1_cross_from_one_worker_to_the_other(workers: Workers) -> None:
    tenant = _tenant()
    sub = Paho(workers.port, client_id="sub", username=f"{tenant}/u")
    sub.connect(source_port=_source_port_on(workers, WORKERS[0]))
    pub = Paho(workers.port, client_id="pub", username=f"{tenant}/u")
    pub.connect(source_port=_source_port_on(workers, WORKERS[1]))
    assert workers.clients(tenant) == {"sub": WORKERS[0], "pub": WORKERS[1]}
    sub.subscribe("cross/#", 1)
    pub.publish("cross/q0", b"zero", 0)
    assert pub.publish("cross/q1", b"one", 1).value == 0
    got = sorted((m.topic, m.payload, m.qos) for m in sub.expect(2))
    assert got == [("cross/q0", b"zero", 0), ("cross/q1", b"one", 1)]
    sub.nothing()
    sub.close()
    pub.close()


def test_persistent_session_resumes_on_the_other_worker_with_its_queue(
    workers: Workers,
) -> None:
    tenant = _tenant()
    durable = Paho(workers.port, "durable", v5=False, username=f"{tenant}/u", clean=False)
    durable.connect(source_port=_source_port_on(workers, WORKERS[0]))
    assert workers.clients(tenant) == {"durable": WORKERS[0]}
    durable.subscribe("keep/#", 1)
    durable.close()
    wait_until(lambda: not workers.clients(tenant))
    pub = Paho(workers.port, client_id="pub", username=f"{tenant}/u")
    pub.connect()
    for i in range(5):
        assert pub.publish(f"keep/{i}", f"m{i}".encode(), 1).value == 0  # acknowledged: kept
    pub.close()

    back = Paho(workers.port, "durable", v5=False, username=f"{tenant}/u", clean=False)
    back.connect(source_port=_source_port_on(workers, WORKERS[1]))
    assert back.session_present
    assert workers.clients(tenant)["durable"] == WORKERS[1]
    got = sorted((m.payload, m.qos) for m in back.expect(5))
    assert got == [(f"m{i}".encode(), 1) for i in range(5)]
    back.close()


def test_same_client_id_on_the_other_worker_takes_the_session_over(workers: Workers) -> None:
    tenant = _tenant()
    first = _raw(workers, tenant, "twin", _source_port_on(workers, WORKERS[0]), level=5)
    assert workers.clients(tenant) == {"twin": WORKERS[0]}
    second = _raw(workers, tenant, "twin", _source_port_on(workers, WORKERS[1]), level=5)
    kicked = first.recv()
    assert isinstance(kicked, Disconnect) and kicked.reason_code == RC.SESSION_TAKEN_OVER
    assert first.closed()
    assert wait_until(lambda: workers.clients(tenant).get("twin") == WORKERS[1])
    assert not second.closed(timeout=0.5)  # the survivor stays
    first.close()
    second.close()


def test_node_workers_below_one_is_refused_naming_the_option(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="node_workers"):
        Launcher(data_dir=tmp_path, nodes=1, mqtt_port=0, node_workers=0)
    cli = starling_in_process("up", "--data-dir", str(tmp_path / "d"), "--node-workers", "0")
    assert cli.returncode == 2
    assert "--node-workers must be at least 1" in cli.stderr
    assert not (tmp_path / "d").exists()  # refused before anything started


def test_a_killed_worker_leaves_the_port_served_by_the_other(workers: Workers) -> None:
    """Last: it changes the mesh (the worker is restarted at the end)."""
    launcher = workers.launcher
    launcher.kill(WORKERS[1])
    tenant = _tenant()
    raws = [_raw(workers, tenant, f"after-{i}") for i in range(16)]
    where = _listed(workers, tenant, 16)
    assert set(where.values()) == {WORKERS[0]}
    for r in raws:
        r.close()

    # Restarted like a node, it takes its share of new connections again.
    launcher.restart(WORKERS[1])
    tenant = _tenant()
    raws = [_raw(workers, tenant, f"again-{i}") for i in range(24)]
    where = _listed(workers, tenant, 24)
    assert set(where.values()) == set(WORKERS)
    for r in raws:
        r.close()
