"""Attacks on shared resources against a real two-node mesh with small limits: a connection
flood from one address and into one tenant, a `$delayed` flood, a retained flood, and a
second user taking over another user's client id. Each attack gets the documented answer
(docs/security.md), is counted in the refusing service's /metrics, and a bystander of
another tenant on the same node keeps connecting and its round trip stays short.

Clients bind distinct loopback source addresses (127.0.0.x) so that "one address" is the
attacker's alone."""

from __future__ import annotations

import re
import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProps

from services.cli.launcher import Launcher, Mesh
from services.common.mqtt import ConnAck, Connect, Decoder, encode
from starling.router.v1 import router_pb2, router_pb2_grpc
from starling.session.v1 import session_pb2, session_pb2_grpc
from tests.conftest import ADMIN_TOKEN
from tests.e2e.clients import TIMEOUT, Paho
from tests.security.bystander import beside_a_bystander

PER_IP = 5
PER_TENANT = 8
DELAYED = 4
RETAINED = 4
QUOTA_EXCEEDED, NOT_AUTHORIZED = 0x97, 0x87
MD = [("authorization", f"Bearer {ADMIN_TOKEN}")]


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    env = {
        "STARLING_ADMIN_TOKEN": ADMIN_TOKEN,
        "STARLING_MAX_CONNECTIONS_PER_IP": str(PER_IP),
        "STARLING_MAX_CONNECTIONS_PER_TENANT": str(PER_TENANT),
        "STARLING_MAX_DELAYED_PER_TENANT": str(DELAYED),
        "STARLING_MAX_RETAINED_PER_TENANT": str(RETAINED),
        "STARLING_ANONYMOUS_TENANTS": '["*"]',
        "STARLING_LOG_LEVEL": "WARNING",
    }
    folder: Path = tmp_path_factory.mktemp("limits")
    launcher = Launcher(
        data_dir=folder, nodes=2, mqtt_port=0, anonymous=True, extra_env=env, ws=False
    )
    mesh = launcher.start(timeout_s=60)
    yield mesh
    launcher.stop()


def port(mesh: Mesh, node: int) -> int:
    return mesh.by_name(f"connection-{node}").port


def tenant(name: str) -> str:
    return f"{name}{uuid.uuid4().hex[:6]}"


# ---- clients ----------------------------------------------------------------------------


class RawConn:
    """One socket from `source`: CONNECT, then the CONNACK exactly as written."""

    def __init__(self, mqtt_port: int, source: str) -> None:
        self.sock = socket.create_connection(
            ("127.0.0.1", mqtt_port), timeout=TIMEOUT, source_address=(source, 0)
        )

    def connect(
        self,
        username: str,
        level: int = 5,
        client_id: str = "",
        password: bytes | None = None,
        clean: bool = True,
    ) -> bytes:
        packet = Connect(
            client_id or f"raw-{uuid.uuid4().hex[:10]}",
            level,
            clean_start=clean,
            username=username,
            password=password,
        )
        self.sock.sendall(encode(packet, level))
        data = b""
        while len(data) < 4:
            chunk = self.sock.recv(4096)  # a whole CONNACK, Reason String included
            if not chunk:
                break
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()


def connack_code(raw: bytes, level: int = 5) -> int:
    (ack,) = Decoder(level).feed(raw)
    assert isinstance(ack, ConnAck)
    return ack.reason_code


def paho(
    mqtt_port: int,
    username: str,
    source: str = "127.0.0.1",
    v5: bool = True,
    client_id: str | None = None,
    password: str | None = None,
    clean: bool = True,
    session_expiry: int | None = None,
    expect_ok: bool = True,
) -> tuple[Paho, Any]:
    """A paho client bound to `source`, and its CONNACK reason (or 3.1.1 return code)."""
    c = Paho(
        mqtt_port, client_id=client_id, v5=v5, username=username, password=password, clean=clean
    )
    kwargs: dict[str, Any] = {"bind_address": source}
    if v5:
        kwargs["clean_start"] = clean
        if session_expiry is not None:
            props = PahoProps(PacketTypes.CONNECT)
            props.SessionExpiryInterval = session_expiry
            kwargs["properties"] = props
    c.c.connect("127.0.0.1", mqtt_port, **kwargs)
    c.c.loop_start()
    rc = c.connacks.get(timeout=TIMEOUT)
    if expect_ok:
        assert not rc.is_failure, f"CONNACK {rc}"
    return c, rc


def refusals(mesh: Mesh, component: str, limit: str, tenant_name: str) -> float:
    """`starling_limit_refusals_total` of `component` for (limit, tenant)."""
    url = f"http://127.0.0.1:{mesh.by_name(component).metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    pattern = re.compile(
        r"^starling_limit_refusals_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.M
    )
    for m in pattern.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
        if labels.get("limit") == limit and labels.get("tenant") == tenant_name:
            return float(m["value"])
    return 0.0


def counted(mesh: Mesh, component: str, limit: str, tenant_name: str, at_least: int) -> float:
    deadline = time.monotonic() + TIMEOUT
    while (value := refusals(mesh, component, limit, tenant_name)) < at_least:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return value


def publish_rc(c: Paho, topic: str, payload: bytes, retain: bool = False) -> int:
    rc = c.publish(topic, payload, qos=1, retain=retain)
    assert rc is not None, "no PUBACK"
    return int(rc.value)


# ---- attacks ------------------------------------------------------------------------------


def _bystander(t: str) -> dict[str, str]:
    """Settings of a bystander of tenant `t` (anonymous access: a user name names it)."""
    return {"username": f"{t}/bystander"}


def test_connection_flood_from_one_address_gets_quota_exceeded(limited: Mesh) -> None:
    calm = tenant("bystander")
    flood_tenant = tenant("ipflood")
    held: list[RawConn] = []

    def flood() -> None:
        held.extend(RawConn(port(limited, 0), "127.0.0.2") for _ in range(PER_IP))
        assert [connack_code(c.connect(f"{flood_tenant}/x")) for c in held] == [0] * PER_IP
        more = RawConn(port(limited, 0), "127.0.0.2")
        assert connack_code(more.connect(f"{flood_tenant}/x")) == QUOTA_EXCEEDED
        more.close()
        v3 = RawConn(port(limited, 0), "127.0.0.2")
        assert v3.connect(f"{flood_tenant}/x", level=4) == b"\x20\x02\x00\x03"  # 3.1.1: 3
        v3.close()

    try:
        beside_a_bystander(port(limited, 0), flood, **_bystander(calm))
        # The bystander's address is not the attacker's: it still connects.
        other, _ = paho(port(limited, 0), f"{calm}/late")
        other.close()
        # The cap is per node: the same address still reaches the other node.
        elsewhere = RawConn(port(limited, 1), "127.0.0.2")
        assert connack_code(elsewhere.connect(f"{flood_tenant}/x")) == 0
        elsewhere.close()
        assert counted(limited, "connection-0", "connections_per_ip", "-", 2) == 2
    finally:
        for c in held:
            c.close()
    # Closed connections free the address's places.
    again = RawConn(port(limited, 0), "127.0.0.2")
    deadline = time.monotonic() + TIMEOUT
    code = connack_code(again.connect(f"{flood_tenant}/x"))
    while code != 0 and time.monotonic() < deadline:
        again.close()
        time.sleep(0.05)
        again = RawConn(port(limited, 0), "127.0.0.2")
        code = connack_code(again.connect(f"{flood_tenant}/x"))
    again.close()
    assert code == 0


@pytest.mark.parametrize("node", [0, 1])
def test_connection_flood_into_one_tenant_is_capped_mesh_wide(limited: Mesh, node: int) -> None:
    calm = tenant("bystander")
    crowd = tenant("crowd")
    held: list[RawConn] = []

    def flood() -> None:
        # Spread over both nodes and several addresses: the cap is the tenant's, mesh-wide.
        held.extend(RawConn(port(limited, i % 2), f"127.0.0.{10 + i}") for i in range(PER_TENANT))
        assert [connack_code(c.connect(f"{crowd}/x")) for c in held] == [0] * PER_TENANT
        for n in (0, 1):
            more = RawConn(port(limited, n), "127.0.0.30")
            assert connack_code(more.connect(f"{crowd}/x")) == QUOTA_EXCEEDED
            more.close()
        v3 = RawConn(port(limited, 0), "127.0.0.30")
        assert v3.connect(f"{crowd}/x", level=4) == b"\x20\x02\x00\x03"
        v3.close()

    try:
        # Other tenants keep their round trip on either node, and still connect.
        beside_a_bystander(port(limited, node), flood, **_bystander(calm))
        late, _ = paho(port(limited, node), f"{calm}/late")
        late.close()
        assert counted(limited, "session", "connections_per_tenant", crowd, 3) == 3
    finally:
        for c in held:
            c.close()


def test_delayed_flood_is_refused_with_quota_exceeded(limited: Mesh) -> None:
    t = tenant("delay")
    attacker, _ = paho(port(limited, 0), f"{t}/x", source="127.0.0.3")

    def flood() -> list[int]:
        return [publish_rc(attacker, f"$delayed/600/d/{i}", b"x") for i in range(DELAYED + 3)]

    try:
        codes = beside_a_bystander(port(limited, 0), flood, **_bystander(tenant("bystander")))
        assert codes == [0] * DELAYED + [QUOTA_EXCEEDED] * 3
    finally:
        attacker.close()
    # MQTT 3.1.1 has no reason code in PUBACK: a plain ack, and the message is not kept.
    v3, _ = paho(port(limited, 1), f"{t}/y", source="127.0.0.3", v5=False)
    try:
        v3.publish("$delayed/600/d/v3", b"x", qos=1)
    finally:
        v3.close()
    assert len(list_delayed(limited, t)) == DELAYED
    assert counted(limited, "router", "delayed_messages", t, 4) == 4


def test_retained_flood_is_refused_and_deleting_still_works(limited: Mesh) -> None:
    t = tenant("retain")
    attacker, _ = paho(port(limited, 1), f"{t}/x", source="127.0.0.4")

    def flood() -> list[int]:
        return [
            publish_rc(attacker, f"r/{i}", b"x" * 100, retain=True) for i in range(RETAINED + 2)
        ]

    try:
        codes = beside_a_bystander(port(limited, 1), flood, **_bystander(tenant("bystander")))
        assert codes == [0] * RETAINED + [QUOTA_EXCEEDED] * 2
        # Deleting a retained message (empty payload) always works and makes room.
        assert publish_rc(attacker, "r/0", b"", retain=True) == 0
        assert publish_rc(attacker, f"r/{RETAINED}", b"x", retain=True) == 0
        assert publish_rc(attacker, "r/new", b"x", retain=True) == QUOTA_EXCEEDED
    finally:
        attacker.close()
    reader, _ = paho(port(limited, 0), f"{t}/reader", source="127.0.0.4")
    try:
        reader.subscribe("r/#", 1)
        topics = sorted(m.topic for m in reader.expect(RETAINED))
        reader.nothing()
    finally:
        reader.close()
    assert topics == sorted(f"r/{i}" for i in range(1, RETAINED + 1))
    assert counted(limited, "router", "retained_messages", t, 3) == 3


def _others_are_refused(limited: Mesh, t: str, cid: str) -> None:
    """Bob again, alice offline with a message queued: MQTT 5 and 3.1.1 both refused; nor
    may an anonymous client (the tenant lets them in) take `cid`."""
    bob5, rc5 = paho(
        port(limited, 0),
        f"{t}/bob",
        client_id=cid,
        password="pw-bob",
        clean=False,
        session_expiry=600,
        expect_ok=False,
    )
    assert rc5.value == NOT_AUTHORIZED and not bob5.session_present
    bob5.nothing()
    bob5.close()
    bob3 = RawConn(port(limited, 1), "127.0.0.1")
    connack = bob3.connect(f"{t}/bob", 4, cid, b"pw-bob", clean=False)
    bob3.close()
    assert connack == b"\x20\x02\x00\x05"  # 3.1.1: no session present, code 5
    anon, rca = paho(port(limited, 0), f"{t}/mallory", client_id=cid, clean=False, expect_ok=False)
    anon.close()
    assert rca.value == NOT_AUTHORIZED


def test_a_second_user_cannot_take_over_a_client_id(limited: Mesh) -> None:
    t = tenant("owners")
    admin, req = session_admin(limited), session_pb2.CreateUserRequest
    for user in ("alice", "bob"):
        admin.CreateUser(req(tenant=t, username=user, password=f"pw-{user}"), metadata=MD)
    cid = f"alice-phone-{uuid.uuid4().hex[:6]}"
    alice, _ = paho(
        port(limited, 0),
        f"{t}/alice",
        client_id=cid,
        password="pw-alice",
        clean=False,
        session_expiry=600,
    )
    alice.subscribe("inbox/alice", 1)
    # Bob, while alice is connected: refused, and alice's connection is not kicked.
    bob, rc = paho(
        port(limited, 1),
        f"{t}/bob",
        client_id=cid,
        password="pw-bob",
        clean=False,
        session_expiry=600,
        expect_ok=False,
    )
    bob.close()
    assert rc.value == NOT_AUTHORIZED
    alice.close(session_expiry=600)

    sender, _ = paho(port(limited, 1), f"{t}/bob", password="pw-bob")
    assert publish_rc(sender, "inbox/alice", b"for alice only") == 0
    sender.close()
    _others_are_refused(limited, t, cid)
    # Alice gets her session and her message back.
    back, _ = paho(
        port(limited, 1),
        f"{t}/alice",
        client_id=cid,
        password="pw-alice",
        clean=False,
        session_expiry=600,
    )
    try:
        assert back.session_present
        (m,) = back.expect(1)
        assert (m.topic, m.payload) == ("inbox/alice", b"for alice only")
    finally:
        back.close(session_expiry=0)
    assert counted(limited, "session", "client_id_owner", t, 4) == 4


# ---- admin helpers ------------------------------------------------------------------------


def session_admin(mesh: Mesh) -> session_pb2_grpc.SessionAdminServiceStub:
    channel = grpc.insecure_channel(f"127.0.0.1:{mesh.by_name('session').grpc_port}")
    return session_pb2_grpc.SessionAdminServiceStub(channel)


def list_delayed(mesh: Mesh, t: str) -> list[router_pb2.DelayedMessage]:
    channel = grpc.insecure_channel(f"127.0.0.1:{mesh.by_name('router').grpc_port}")
    stub = router_pb2_grpc.RouterAdminServiceStub(channel)
    resp = stub.ListDelayed(router_pb2.ListDelayedRequest(tenant=t), metadata=MD)
    channel.close()
    return list(resp.messages)
