"""Tenant-scoped admin tokens against the shared two-node mesh (issue 12): a token of tenant A
cannot read or change tenant B on any service, nor raise its own limits, nor make calls that
span every tenant; expired, revoked and forged tokens are refused everywhere. The doors
themselves (gRPC, NATS, Redis, secrets): test_internal_doors.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from starling.connection.v1 import connection_pb2, connection_pb2_grpc
from starling.metrics.v1 import metrics_pb2, metrics_pb2_grpc
from starling.quota.v1 import quota_pb2, quota_pb2_grpc
from starling.session.v1 import admin_tokens_pb2 as tokens_pb
from starling.session.v1 import admin_tokens_pb2_grpc as tokens_grpc
from starling.session.v1 import session_pb2, session_pb2_grpc
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.poll import wait_until
from tests.security.admin_token_calls import (
    TENANT_CALLS,
    _bearer,
    _code,
    _create_token,
    _revoke,
    _tenant,
)


@pytest.mark.parametrize("component", list(TENANT_CALLS))
def test_a_tenant_token_administers_its_tenant_only(mesh: MeshInfo, component: str) -> None:
    acme, other = _tenant("acme"), _tenant("other")
    made = _create_token(mesh, acme)
    assert _code(mesh, component, acme, made.token) == (grpc.StatusCode.OK, "")
    code, details = _code(mesh, component, other, made.token)
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert details == f"token {made.info.token_id} administers tenant {acme!r}, not {other!r}"
    # The operator token administers both.
    assert _code(mesh, component, other, ADMIN_TOKEN)[0] == grpc.StatusCode.OK


def test_a_tenant_token_cannot_change_another_tenant(mesh: MeshInfo) -> None:
    acme, other = _tenant("acme"), _tenant("other")
    token = _create_token(mesh, acme).token
    with grpc.insecure_channel(mesh.addr("session")) as ch:
        stub = session_pb2_grpc.SessionAdminServiceStub(ch)
        create = session_pb2.CreateUserRequest(tenant=other, username="mallory", password="pw")
        with pytest.raises(grpc.RpcError) as info:
            stub.CreateUser(create, metadata=_bearer(token))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as info:
            stub.SetAcl(session_pb2.SetAclRequest(tenant=other), metadata=_bearer(token))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        stub.CreateUser(
            session_pb2.CreateUserRequest(tenant=acme, username="ops", password="pw"),
            metadata=_bearer(token),
        )
    with grpc.insecure_channel(mesh.addr("quota")) as ch:
        with pytest.raises(grpc.RpcError) as info:
            quota_pb2_grpc.QuotaAdminServiceStub(ch).SetLimits(
                quota_pb2.SetLimitsRequest(tenant=other), metadata=_bearer(token)
            )
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_tenant_token_cannot_raise_its_own_limits(mesh: MeshInfo) -> None:
    acme = _tenant("acme")
    token = _create_token(mesh, acme).token
    raise_own = quota_pb2.SetLimitsRequest(tenant=acme, limits=quota_pb2.Limits(max_connections=9))
    with grpc.insecure_channel(mesh.addr("quota")) as ch:
        stub = quota_pb2_grpc.QuotaAdminServiceStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.SetLimits(raise_own, metadata=_bearer(token))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "needs the operator token" in (info.value.details() or "")
        # Reading them stays the tenant's; setting them is the operator's.
        stub.GetLimits(quota_pb2.GetLimitsRequest(tenant=acme), metadata=_bearer(token))
        stub.SetLimits(raise_own, metadata=_bearer(ADMIN_TOKEN))


def test_cross_tenant_calls_are_the_operators(mesh: MeshInfo) -> None:
    """Calls that span every tenant (cluster stats, node stats, token management) refuse a
    tenant token with a message, and serve the operator."""
    made = _create_token(mesh, _tenant("acme"))
    calls: list[tuple[str, Callable[[grpc.Channel, Any], Any]]] = [
        (
            "metrics",
            lambda ch, md: metrics_pb2_grpc.MetricsAdminServiceStub(ch).GetClusterStats(
                metrics_pb2.GetClusterStatsRequest(), metadata=md
            ),
        ),
        (
            "connection-0",
            lambda ch, md: connection_pb2_grpc.ConnectionAdminServiceStub(ch).GetNodeStats(
                connection_pb2.GetNodeStatsRequest(), metadata=md
            ),
        ),
        (
            "session",
            lambda ch, md: tokens_grpc.TokenAdminServiceStub(ch).ListAdminTokens(
                tokens_pb.ListAdminTokensRequest(), metadata=md
            ),
        ),
    ]
    for component, call in calls:
        with grpc.insecure_channel(mesh.addr(component)) as ch:
            with pytest.raises(grpc.RpcError) as info:
                call(ch, _bearer(made.token))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, component
            assert "operator token" in (info.value.details() or ""), component
            call(ch, _bearer(ADMIN_TOKEN))


def test_expired_and_revoked_tokens_are_refused_everywhere(mesh: MeshInfo) -> None:
    acme = _tenant("acme")
    short = _create_token(mesh, acme, ttl_s=1)
    revoked = _create_token(mesh, acme)
    for component in TENANT_CALLS:  # both work, and the other services have cached them
        assert _code(mesh, component, acme, revoked.token)[0] == grpc.StatusCode.OK
        wait_until(
            lambda c=component: (
                _code(mesh, c, acme, short.token)[0] == grpc.StatusCode.UNAUTHENTICATED
            ),
            10,
            f"{component} still accepts an expired token",
        )
    assert _revoke(mesh, revoked.info.token_id)
    assert _code(mesh, "session", acme, revoked.token)[0] == grpc.StatusCode.UNAUTHENTICATED
    for component in TENANT_CALLS:  # within admin_token_cache_s (5 s by default)
        wait_until(
            lambda c=component: (
                _code(mesh, c, acme, revoked.token)[0] == grpc.StatusCode.UNAUTHENTICATED
            ),
            15,
            f"{component} still accepts a revoked token",
        )
    _, details = _code(mesh, "router", acme, revoked.token)
    assert details == "admin token missing, wrong, expired or revoked"
    # A forged token of the right shape (an existing id, a wrong secret) is no better.
    live = _create_token(mesh, acme)
    forged = live.token[: -len("0" * 64)] + "0" * 64
    assert _code(mesh, "router", acme, forged)[0] == grpc.StatusCode.UNAUTHENTICATED
