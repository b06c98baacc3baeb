"""Tenant-scoped admin tokens as the security tests use them (issue 12): make and revoke a
token with the operator's, and one admin call per service that names a tenant, answering
its gRPC status and details."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import grpc

from starling.queue.v1 import queue_pb2, queue_pb2_grpc
from starling.quota.v1 import quota_pb2, quota_pb2_grpc
from starling.router.v1 import router_pb2, router_pb2_grpc
from starling.session.v1 import admin_tokens_pb2 as tokens_pb
from starling.session.v1 import admin_tokens_pb2_grpc as tokens_grpc
from starling.session.v1 import session_pb2, session_pb2_grpc
from tests.conftest import ADMIN_TOKEN, MeshInfo


def _bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def _tenant(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:6]}"


def _create_token(
    mesh: MeshInfo, tenant: str, ttl_s: int = 3600
) -> tokens_pb.CreateAdminTokenResponse:
    with grpc.insecure_channel(mesh.addr("session")) as ch:
        return tokens_grpc.TokenAdminServiceStub(ch).CreateAdminToken(  # type: ignore[no-any-return]
            tokens_pb.CreateAdminTokenRequest(tenant=tenant, ttl_s=ttl_s),
            metadata=_bearer(ADMIN_TOKEN),
        )


def _revoke(mesh: MeshInfo, token_id: str) -> bool:
    with grpc.insecure_channel(mesh.addr("session")) as ch:
        return bool(
            tokens_grpc.TokenAdminServiceStub(ch)
            .RevokeAdminToken(
                tokens_pb.RevokeAdminTokenRequest(token_id=token_id),
                metadata=_bearer(ADMIN_TOKEN),
            )
            .revoked
        )


# One admin call per service that names a tenant: (component, call(channel, tenant, metadata)).
TENANT_CALLS: dict[str, Callable[[grpc.Channel, str, Any], Any]] = {
    "session": lambda ch, t, md: session_pb2_grpc.SessionAdminServiceStub(ch).ListClients(
        session_pb2.ListClientsRequest(tenant=t), metadata=md, timeout=10
    ),
    "router": lambda ch, t, md: router_pb2_grpc.RouterAdminServiceStub(ch).ListRetained(
        router_pb2.ListRetainedRequest(tenant=t, topic_filter="#"), metadata=md, timeout=10
    ),
    "queue": lambda ch, t, md: queue_pb2_grpc.QueueAdminServiceStub(ch).GetQueueStats(
        queue_pb2.GetQueueStatsRequest(tenant=t), metadata=md, timeout=10
    ),
    "quota": lambda ch, t, md: quota_pb2_grpc.QuotaAdminServiceStub(ch).GetLimits(
        quota_pb2.GetLimitsRequest(tenant=t), metadata=md, timeout=10
    ),
}


def _code(mesh: MeshInfo, component: str, tenant: str, token: str) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(mesh.addr(component)) as ch:
        try:
            TENANT_CALLS[component](ch, tenant, _bearer(token))
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""
