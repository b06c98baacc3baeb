"""Internal doors of a real mesh (issue 11).

Against the shared two-node mesh started by `Launcher` (tests/conftest.py), as an attacker on
the same machine or network would try it: NATS, Redis and every gRPC port refuse a caller
without credentials; each service's NATS user holds only its subjects; no secret reaches a log
file, a command line or a world-readable file. Tenant-scoped admin tokens (issue 12):
test_admin_tokens.py.
"""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path
from typing import Any

import grpc
import nats
import pytest
from google.protobuf.descriptor import FileDescriptor
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, ResponseError

from services.common.bus.flushing import flushed
from services.common.rpc.credentials import MESH_METADATA_KEY
from starling.connection.v1 import connection_pb2
from starling.metrics.v1 import metrics_pb2, metrics_pb2_grpc
from starling.queue.v1 import queue_pb2
from starling.quota.v1 import quota_pb2
from starling.router.v1 import router_pb2
from starling.rules.v1 import rules_pb2
from starling.session.v1 import admin_tokens_pb2 as tokens_pb
from starling.session.v1 import session_pb2
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.poll import eventually
from tests.security.admin_token_calls import _code, _create_token, _tenant

# The proto files each component serves.
SERVED: dict[str, list[FileDescriptor]] = {
    "session": [session_pb2.DESCRIPTOR, tokens_pb.DESCRIPTOR],
    "router": [router_pb2.DESCRIPTOR],
    "queue": [queue_pb2.DESCRIPTOR],
    "quota": [quota_pb2.DESCRIPTOR],
    "metrics": [metrics_pb2.DESCRIPTOR],
    "rules": [rules_pb2.DESCRIPTOR],
    "connection-0": [connection_pb2.DESCRIPTOR],
    "connection-1": [connection_pb2.DESCRIPTOR],
}
REGISTERED: dict[str, bool] = {}  # a service that registers no servicer: UNIMPLEMENTED


def _raw_call(address: str, path: str, metadata: Any = None) -> grpc.StatusCode:
    """Status of one unary call with an empty request (raw bytes: any method of any service)."""
    with grpc.insecure_channel(address) as ch:
        try:
            ch.unary_unary(path)(b"", metadata=metadata, timeout=10)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK


# ---- gRPC ------------------------------------------------------------------------------------


@pytest.mark.parametrize("component", list(SERVED))
def test_every_grpc_method_refuses_a_caller_without_credentials(
    mesh: MeshInfo, component: str
) -> None:
    address = mesh.addr(component)
    checked = 0
    for file in SERVED[component]:
        for service in file.services_by_name.values():
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                code = _raw_call(address, path)
                if not REGISTERED.get(component, True):
                    assert code == grpc.StatusCode.UNIMPLEMENTED, path
                    continue
                assert code == grpc.StatusCode.UNAUTHENTICATED, path
                wrong = [(MESH_METADATA_KEY, "guess"), ("authorization", "Bearer guess")]
                assert _raw_call(address, path, wrong) == grpc.StatusCode.UNAUTHENTICATED, path
                checked += 1
    # Reflection (it lists the API) is internal too; health stays open for probes.
    reflection = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
    with grpc.insecure_channel(address) as ch:
        call = ch.stream_stream(reflection)(iter([b""]), timeout=10)
        with pytest.raises(grpc.RpcError) as info:
            list(call)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _raw_call(address, "/grpc.health.v1.Health/Check") == grpc.StatusCode.OK
    assert checked or not REGISTERED.get(component, True)


def test_the_mesh_secret_opens_internal_methods(mesh: MeshInfo) -> None:
    """The same call with the mesh's secret gets past the door (to a request check)."""
    secret = mesh.launcher.secrets.mesh_secret
    with grpc.insecure_channel(mesh.addr("metrics")) as ch:
        stub = metrics_pb2_grpc.MetricsServiceStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.ReportNodeStats(
                metrics_pb2.ReportNodeStatsRequest(), metadata=[(MESH_METADATA_KEY, secret)]
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# ---- NATS and Redis --------------------------------------------------------------------------


async def _nats_refused(url: str) -> str:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    with pytest.raises(Exception):  # noqa: B017 - nats-py raises several types for a refusal
        nc = await nats.connect(
            url,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=3,
            error_cb=on_error,
        )
        await nc.close()
    return " ".join(errors)


async def test_nats_refuses_clients_without_credentials(mesh: MeshInfo) -> None:
    port = mesh.mesh.by_name("nats").port
    assert "authorization" in (await _nats_refused(f"nats://127.0.0.1:{port}")).lower()
    assert (
        "authorization"
        in (await _nats_refused(f"nats://connection:wrong@127.0.0.1:{port}")).lower()
    )
    nc = await nats.connect(mesh.nats_url)  # the operator user gets in
    await nc.close()


async def test_a_service_nats_user_holds_only_its_subjects(mesh: MeshInfo) -> None:
    """The queue service's user may not kick clients (ctl.node.*) nor read MQTT traffic."""
    port = mesh.mesh.by_name("nats").port
    password = mesh.launcher.secrets.nats["queue"]
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(f"nats://queue:{password}@127.0.0.1:{port}", error_cb=on_error)
    try:
        await nc.publish("ctl.node.connection-0", b"x")
        await nc.subscribe("mq.>")
        await flushed(nc)
        await eventually(
            lambda: len([e for e in errors if "permissions violation" in e.lower()]) >= 2,
            10,
            "the permission violations",
        )
    finally:
        await nc.close()


async def test_a_node_may_route_but_never_append_unchecked_or_serve_the_router(
    mesh: MeshInfo,
) -> None:
    """The persistent path runs over NATS (svc.router.route, svc.queue.direct,
    svc.queue.append): a connection node's user may ask the router and append as checked
    against the route table's version, but neither append unchecked (svc.queue.append, at
    any instance), fence versions or publish route changes as the router, announce queue
    partitions (ctl.queue.owners), nor pose as the router
    (subscribe to its subject) to take other nodes' publishes."""
    port = mesh.mesh.by_name("nats").port
    password = mesh.launcher.secrets.nats["connection"]
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(f"nats://connection:{password}@127.0.0.1:{port}", error_cb=on_error)
    try:
        await nc.publish("svc.queue.append", b"x")
        await nc.publish("svc.queue.append.queue-0123", b"x")  # at one instance
        await nc.publish("svc.queue.routes", b"x")
        await nc.publish("rt.routes.default", b"x")
        await nc.publish("ctl.queue.owners", b"x")  # posing as a queue instance
        await nc.subscribe("svc.router.route")
        await flushed(nc)
        await eventually(
            lambda: len([e for e in errors if "permissions violation" in e.lower()]) >= 6,
            10,
            "the permission violations",
        )
        # Asking the router is allowed: a bad request gets a status, not a violation.
        reply = await nc.request("svc.router.route", b"\xff", timeout=5)
        assert reply.headers and reply.headers.get("Starling-Error", "").startswith(
            "INVALID_ARGUMENT malformed RoutePersistentRequest"
        )
        # So is a checked append; one without a version is refused by the queue.
        reply = await nc.request("svc.queue.direct", b"\n\x01t", timeout=5)
        assert reply.headers and reply.headers.get("Starling-Error", "").startswith(
            "INVALID_ARGUMENT routes_checked is required"
        )
    finally:
        await nc.close()


async def test_a_node_may_connect_clients_but_never_serve_the_session_service(
    mesh: MeshInfo,
) -> None:
    """The CONNECT path runs over NATS (svc.session.connect(s)/disconnect, svc.router.will): a
    node's user may ask, but may not subscribe to these subjects (posing as the session
    service, it would accept any client and read every CONNECT's credentials) nor announce
    user and ACL changes (ctl.session.changed) to the session services; the queue service's
    user may not ask at all."""
    port = mesh.mesh.by_name("nats").port
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    def violations() -> int:
        return len([e for e in errors if "permissions violation" in e.lower()])

    node = mesh.launcher.secrets.nats["connection"]
    nc = await nats.connect(f"nats://connection:{node}@127.0.0.1:{port}", error_cb=on_error)
    try:
        await nc.subscribe("svc.session.connect")
        await nc.subscribe("svc.session.connects")
        await nc.subscribe("svc.session.disconnect")
        await nc.subscribe("svc.router.will")
        await nc.publish("ctl.session.changed", b"acl\0default")
        await flushed(nc)
        await eventually(lambda: violations() >= 5, 10, "the permission violations")
        # Asking is allowed: a bad request gets a status, not a violation.
        for subject, name in (
            ("svc.session.connect", "ConnectRequest"),
            ("svc.session.connects", "ConnectManyRequest"),
            ("svc.session.disconnect", "DisconnectRequest"),
            ("svc.router.will", "SettleWillRequest"),
        ):
            reply = await nc.request(subject, b"\xff", timeout=5)
            assert reply.headers and reply.headers.get("Starling-Error", "").startswith(
                f"INVALID_ARGUMENT malformed {name}"
            ), subject
    finally:
        await nc.close()

    errors.clear()
    queue = mesh.launcher.secrets.nats["queue"]
    nc = await nats.connect(f"nats://queue:{queue}@127.0.0.1:{port}", error_cb=on_error)
    try:
        await nc.publish("svc.session.connect", b"x")
        await flushed(nc)
        await eventually(lambda: violations() >= 1, 10, "the permission violations")
    finally:
        await nc.close()


async def test_redis_refuses_clients_without_the_password(mesh: MeshInfo) -> None:
    port = mesh.mesh.by_name("redis").port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET anything\r\nKEYS *\r\n")
    await writer.drain()
    assert (await reader.readline()).startswith(b"-NOAUTH")
    assert (await reader.readline()).startswith(b"-NOAUTH")
    writer.close()
    bare = Redis(host="127.0.0.1", port=port)
    with pytest.raises((AuthenticationError, ResponseError)):
        await bare.get("anything")
    await bare.aclose()
    wrong = Redis(host="127.0.0.1", port=port, password="guess")
    with pytest.raises((AuthenticationError, ResponseError)):
        await wrong.ping()
    await wrong.aclose()
    right = Redis(host="127.0.0.1", port=port, password=mesh.launcher.secrets.redis_password)
    assert await right.ping()
    await right.aclose()


# ---- secrets at rest and in logs -------------------------------------------------------------


def test_secret_files_are_private(mesh: MeshInfo) -> None:
    root = Path(mesh.mesh.data_dir)
    assert stat.S_IMODE((root / "secrets").stat().st_mode) == 0o700
    for path in (
        root / "secrets" / "secrets.json",
        root / "secrets" / "admin-token",
        root / "nats.conf",
        root / "redis.conf",
    ):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert (root / "secrets" / "admin-token").read_text().strip() == ADMIN_TOKEN


def test_no_secret_in_logs_or_command_lines(mesh: MeshInfo) -> None:
    """Every secret of the mesh, and tenant tokens used against it, absent from every log file
    and every component's command line (visible to all local users through ps)."""
    made = _create_token(mesh, _tenant("acme"))
    _code(mesh, "router", "someone-else", made.token)  # a refused call: logged, token hidden
    _code(mesh, "router", "x", "stk_0123456789ab_" + "f" * 64)  # a bad token of the right shape
    secrets = [*mesh.launcher.secrets.values(), ADMIN_TOKEN, made.token, made.token[17:]]
    logs = mesh.logs()
    assert {p.name for p in logs} >= {"session.log", "router.log", "nats.log", "redis.log"}
    assert any("service_config" in p.read_text() for p in logs)
    for path in logs:
        text = path.read_text(errors="replace")
        for secret in secrets:
            assert secret not in text, f"a secret is in {path}"
    for comp in mesh.mesh.components:
        cmdline = Path(f"/proc/{comp.pid}/cmdline").read_bytes().decode(errors="replace")
        for secret in secrets:
            assert secret not in cmdline, f"a secret is on {comp.name}'s command line"


async def test_the_session_service_may_acknowledge_the_events_it_records(mesh: MeshInfo) -> None:
    """Its NATS user holds exactly the subjects it needs, acks of the event log's consumer
    included: without them every event came back after the ack wait, for ever."""
    from services.session.event_recorder import DURABLE
    from tests.e2e.clients import Paho

    client = Paho(mesh.node(0))
    client.connect()  # a connected event on EVENTS
    client.close()
    nc = await nats.connect(mesh.nats_url)
    try:
        js = nc.jetstream()

        async def settled() -> Any:
            info = await js.consumer_info("EVENTS", DURABLE)
            return info if info.num_ack_pending == 0 and info.num_pending == 0 else None

        info = await eventually(settled, 15, "events acknowledged", every_s=0.2)
        assert info.num_redelivered == 0
    finally:
        await nc.close()
