"""The audit of admin changes made through the gRPC admin APIs (services/common/rpc/audit.py):
a real gRPC server with the mesh's interceptors and a real SQLite audit store. Changes are
recorded with who, tenant, method, target, peer and outcome (refusals at the door too);
reads are not; the console's own calls (marked, with the mesh secret) are not recorded twice,
while the mark without the secret counts for nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import grpc
import pytest

from services.common.admin_tokens import new_token
from services.common.rpc.admin_auth import TenantGrant
from services.common.rpc.audit import UNAUTHENTICATED_PER_MINUTE, AuditLog, changes, target_of
from services.common.rpc.credentials import AUDITED_BY_KEY, MESH_METADATA_KEY
from services.common.rpc.server import ServerAuth, create_server
from services.common.store.sqlite_audit import SqliteAuditStore
from starling.rules.v1 import rules_pb2
from starling.session.v1 import session_pb2 as pb
from tests.poll import eventually

OPERATOR = "operator-token"
SECRET = "mesh-secret"
TENANT_TOKEN_ID, TENANT_TOKEN = new_token()
SERVICE = "starling.session.v1.SessionAdminService"


class Tokens:
    """The one tenant token this server knows (tenant "acme")."""

    async def resolve(self, token: str) -> TenantGrant | None:
        return TenantGrant("acme", TENANT_TOKEN_ID) if token == TENANT_TOKEN else None


async def _kick(request: pb.KickClientRequest, ctx: grpc.aio.ServicerContext) -> object:
    return pb.KickClientResponse(kicked=True)


async def _list(request: pb.ListClientsRequest, ctx: grpc.aio.ServicerContext) -> object:
    return pb.ListClientsResponse()


def _register(server: grpc.aio.Server) -> Iterable[str]:
    def handler(fn: object, req: type, resp: type) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
        )

    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "KickClient": handler(_kick, pb.KickClientRequest, pb.KickClientResponse),
                    "ListClients": handler(_list, pb.ListClientsRequest, pb.ListClientsResponse),
                },
            )
        ]
    )
    return [SERVICE]


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[str, SqliteAuditStore]]:
    audit = AuditLog(lambda: SqliteAuditStore(tmp_path / "audit.db"))
    auth = ServerAuth(mesh_secret=SECRET, admin_token=OPERATOR, tokens=Tokens(), audit=audit)
    srv, port, _ = create_server("127.0.0.1:0", _register, auth=auth)
    await srv.start()
    reader = SqliteAuditStore(tmp_path / "audit.db")
    yield f"127.0.0.1:{port}", reader
    await srv.stop(0)
    await audit.close()
    await reader.close()


async def _call(address: str, method: str, request: object, md: list[tuple[str, str]]) -> str:
    """The call's status code name."""
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_unary(
            f"/{SERVICE}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lambda b: b,
        )
        try:
            await call(request, metadata=md, timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
        return "OK"


def _count(store: SqliteAuditStore) -> int:
    return int(store.db.execute("SELECT count(*) FROM audit").fetchone()[0])


def _bearer(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


async def test_changes_are_recorded_with_who_what_where_and_outcome(
    server: tuple[str, SqliteAuditStore],
) -> None:
    address, store = server
    kick = pb.KickClientRequest(tenant="acme", client_id="dev-1")
    assert await _call(address, "KickClient", kick, _bearer(OPERATOR)) == "OK"
    assert await _call(address, "KickClient", kick, _bearer(TENANT_TOKEN)) == "OK"
    other = pb.KickClientRequest(tenant="globex", client_id="dev-2")
    assert await _call(address, "KickClient", other, _bearer(TENANT_TOKEN)) == "PERMISSION_DENIED"
    assert await _call(address, "KickClient", kick, _bearer("wrong")) == "UNAUTHENTICATED"
    # A read is not a change.
    listed = pb.ListClientsRequest(tenant="acme")
    assert await _call(address, "ListClients", listed, _bearer(OPERATOR)) == "OK"

    # A refusal's status goes out as the door aborts the call: its record may follow it.
    await eventually(lambda: _count(store) >= 4, what="4 audit records")
    got = list(reversed(await store.recent(None, 10)))
    who = [(r.actor, r.tenant, r.target, r.outcome) for r in got]
    assert who == [
        ("operator", "acme", "client_id=dev-1", "ok"),
        (f"tenant acme (token {TENANT_TOKEN_ID})", "acme", "client_id=dev-1", "ok"),
        (
            f"tenant acme (token {TENANT_TOKEN_ID})",
            "globex",
            "client_id=dev-2",
            "PERMISSION_DENIED",
        ),
        ("unknown token", "acme", "client_id=dev-1", "UNAUTHENTICATED"),
    ]
    assert {r.action for r in got} == {"SessionAdminService/KickClient"}
    assert all(r.address.startswith("127.0.0.1:") and r.at_ms > 0 for r in got)


async def test_the_consoles_own_calls_are_not_recorded_twice(
    server: tuple[str, SqliteAuditStore],
) -> None:
    address, store = server
    kick = pb.KickClientRequest(tenant="acme", client_id="dev-1")
    marked = [*_bearer(OPERATOR), (AUDITED_BY_KEY, "console")]
    assert await _call(address, "KickClient", kick, [*marked, (MESH_METADATA_KEY, SECRET)]) == "OK"
    assert await store.recent(None, 10) == []
    # The mark alone (no mesh secret, or a wrong one) keeps nothing out of the log.
    assert await _call(address, "KickClient", kick, marked) == "OK"
    assert await _call(address, "KickClient", kick, [*marked, (MESH_METADATA_KEY, "x")]) == "OK"
    assert [r.outcome for r in await store.recent(None, 10)] == ["ok", "ok"]


def test_which_methods_change_and_what_they_act_on() -> None:
    assert changes("/starling.session.v1.SessionAdminService/KickClient")
    assert changes("/starling.rules.v1.RulesAdminService/SetRuleEnabled")
    for read in ("ListClients", "GetAcl", "TestRule"):
        assert not changes(f"/starling.x.v1.XAdminService/{read}")
    assert not changes("/starling.session.v1.SessionService/Connect")  # internal, not admin
    rule = rules_pb2.CreateRuleRequest(rule=rules_pb2.Rule(tenant="acme", rule_id="r1"))
    assert target_of(rule) == "rule_id=r1"
    assert target_of(pb.ListClientsRequest(tenant="acme")) == ""


async def test_token_guessing_cannot_grow_the_log_without_bound(
    server: tuple[str, SqliteAuditStore],
) -> None:
    address, store = server
    kick = pb.KickClientRequest(tenant="acme", client_id="dev-1")
    for i in range(UNAUTHENTICATED_PER_MINUTE + 40):
        assert await _call(address, "KickClient", kick, _bearer(f"guess-{i}")) == "UNAUTHENTICATED"
    await eventually(lambda: _count(store) >= UNAUTHENTICATED_PER_MINUTE, what="refusals")
    # A real change after the guesses is still recorded; the guesses past the budget are not.
    assert await _call(address, "KickClient", kick, _bearer(OPERATOR)) == "OK"
    await eventually(lambda: _count(store) == UNAUTHENTICATED_PER_MINUTE + 1, what="the change")
    assert (await store.recent(None, 1))[0].actor == "operator"
