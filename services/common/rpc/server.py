"""gRPC server build and graceful stop, with health checking and reflection on every server.

`create_server(address, register, auth=...)` returns `(server, port)` so tests can bind port 0;
call `health.set(name, SERVING)` once the service is ready and `stop_server` on SIGTERM.
`ServerAuth` says which doors the server locks (services/common/rpc/interceptors.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common.rpc.admin_auth import TokenResolver
from services.common.rpc.audit import AuditInterceptor, AuditLog
from services.common.rpc.health_status import failed_check
from services.common.rpc.interceptors import (
    AdminAuthInterceptor,
    ErrorAndTraceInterceptor,
    MeshSecretInterceptor,
    RedInterceptor,
)
from services.common.rpc.limits import grpc_options

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass(frozen=True)
class ServerAuth:
    """The credentials a server checks.

    `mesh_secret`: internal methods need it (None: mesh_auth=disabled, no check; "" refuses
    every internal call). `admin_token`: the operator token ("" matches nothing);
    `admin_disabled`: admin_auth=disabled; `tokens`: resolves tenant-scoped admin tokens;
    `audit`: where admin changes are recorded (services/common/rpc/audit.py; None: nowhere).
    """

    mesh_secret: str | None
    admin_token: str = ""
    admin_disabled: bool = False
    tokens: TokenResolver | None = None
    audit: AuditLog | None = None


def create_server(
    address: str,
    register: Callable[[grpc.aio.Server], Iterable[str]],
    *,
    auth: ServerAuth,
) -> tuple[grpc.aio.Server, int, health.aio.HealthServicer]:
    """Build a server at `address` ("host:port", port 0 allowed).

    `register(server)` adds servicers and returns their full service names, which are
    announced through reflection and health. Returns (server, bound port, health servicer).
    """
    audit: list[grpc.aio.ServerInterceptor] = []
    if auth.audit is not None:
        audit.append(
            AuditInterceptor(
                auth.audit,
                operator_token=auth.admin_token,
                mesh_secret=auth.mesh_secret,
                tokens=auth.tokens,
            )
        )
    server = grpc.aio.server(
        interceptors=[
            RedInterceptor(),
            MeshSecretInterceptor(auth.mesh_secret),
            *audit,
            AdminAuthInterceptor(
                auth.admin_token, disabled=auth.admin_disabled, tokens=auth.tokens
            ),
            ErrorAndTraceInterceptor(),
        ],
        # Limits from the mesh's largest MQTT packet (services/common/rpc/limits.py).
        options=[("grpc.so_reuseport", 0), *grpc_options()],
    )
    names = list(register(server))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [
            *names,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ],
        server,
    )
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind gRPC server to {address}")
    return server, port, health_servicer


async def set_serving(health_servicer: health.aio.HealthServicer, names: Iterable[str]) -> None:
    await health_servicer.set("", SERVING)
    for name in names:
        await health_servicer.set(name, SERVING)


async def set_not_serving(health_servicer: health.aio.HealthServicer, names: Iterable[str]) -> None:
    await health_servicer.set("", NOT_SERVING)
    for name in names:
        await health_servicer.set(name, NOT_SERVING)


async def stop_server(
    server: grpc.aio.Server, health_servicer: health.aio.HealthServicer, grace_s: float
) -> None:
    """Report NOT_SERVING, then let in-flight calls finish within `grace_s`."""
    await health_servicer.enter_graceful_shutdown()
    await server.stop(grace_s)


async def check_health(address: str, timeout_s: float = 1.0, service: str = "") -> str:
    """Health status name ("SERVING", "NOT_SERVING", "UNREACHABLE") of the server at address."""
    async with grpc.aio.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        try:
            resp = await stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            return failed_check(exc.code())
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))
