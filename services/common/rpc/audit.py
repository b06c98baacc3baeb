"""The audit of admin changes made through the gRPC admin APIs: `AuditInterceptor` appends one
`AuditRecord` to the store's audit table (services/common/store/audit_log.py) for each call of
an *AdminService method that changes something, whoever made it (the CLI, a script, another
service): who (the operator, or the tenant token's tenant and id), on which tenant, what (the
method and its target), when, from where (the gRPC peer) and how it ended ("ok" or the
status code's name, refusals at the door included).

Read-only methods (`READ_ONLY_PREFIXES`: List*, Get*, Test*) are not recorded. Calls the
console makes are not recorded here: it records them itself, with its own action names and the
signed-in person's browser address, and marks its outgoing calls `x-starling-audited-by:
console` (services/common/rpc/credentials.py). The mark counts only on a call that also carries
the mesh secret, so a caller outside the mesh cannot keep its changes out of the log.

Every service writes the shared audit table itself (SQLite under the data dir on one machine,
Cassandra in a cluster): each already has the store's settings, so no single writer is needed,
and a record is in the store before the caller gets its answer. The store is opened on the
first audited call (`AuditLog`); a record that cannot be written is logged, never fails the
call whose change already happened.
"""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from services.common.admin_tokens import PREFIX as TENANT_TOKEN_PREFIX
from services.common.clock import now_ms
from services.common.rpc.admin_auth import TokenResolver, tenant_of
from services.common.rpc.credentials import AUDITED_BY_KEY, MESH_METADATA_KEY
from services.common.store.audit_log import AuditRecord, AuditStore

log = logging.getLogger("starling.rpc.audit")

READ_ONLY_PREFIXES = ("List", "Get", "Test")
# Calls refused for a missing or wrong token are recorded up to this many a minute per
# process; past it they are counted and logged once a minute (a caller guessing tokens
# cannot grow the audit log without bound).
UNAUTHENTICATED_PER_MINUTE = 60
# The request fields that name what a change acts on, by preference.
TARGET_FIELDS = (
    "client_id",
    "username",
    "rule_id",
    "token_id",
    "topic",
    "topic_filter",
    "filter",
    "node_id",
    "ban_id",
    "value",
    "id",
    "name",
)

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]


class AuditLog:
    """Opens the audit store (`open_store`) on the first record and closes it at `close`."""

    def __init__(self, open_store: Callable[[], AuditStore]) -> None:
        self._open = open_store
        self._store: AuditStore | None = None

    async def append(self, record: AuditRecord) -> None:
        if self._store is None:
            self._store = self._open()
        await self._store.append(record)

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
            self._store = None


def changes(method: str) -> bool:
    """An admin method that changes something ("/pkg.XAdminService/CreateUser")."""
    service, _, name = method.rpartition("/")
    return service.endswith("AdminService") and not name.startswith(READ_ONLY_PREFIXES)


def target_of(request: Message) -> str:
    """`field=value` of the first field in TARGET_FIELDS the request (or a message field of
    it, such as CreateRuleRequest.rule) sets; "" when none."""
    for message in (request, *_inner(request)):
        fields = message.DESCRIPTOR.fields_by_name
        for name in TARGET_FIELDS:
            field = fields.get(name)
            if field is None or field.message_type is not None or field.is_repeated:
                continue
            value = getattr(message, name)
            if value not in ("", 0):
                return f"{name}={value}"
    return ""


def _inner(request: Message) -> list[Message]:
    return [
        getattr(request, f.name)
        for f in request.DESCRIPTOR.fields
        if f.message_type is not None and not f.is_repeated and request.HasField(f.name)
    ]


def _metadata(details: grpc.HandlerCallDetails) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in details.invocation_metadata or ():
        out[k] = v.decode() if isinstance(v, bytes) else str(v)
    return out


def _peer(ctx: grpc.aio.ServicerContext) -> str:
    peer = str(ctx.peer() or "")
    for scheme in ("ipv4:", "ipv6:"):
        if peer.startswith(scheme):
            return peer[len(scheme) :]
    return peer


class AuditInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Records admin changes (module docstring). Sits outside `AdminAuthInterceptor`, so a
    change the door refuses is recorded with its status too."""

    def __init__(
        self,
        log_: AuditLog,
        *,
        operator_token: str,
        mesh_secret: str | None,
        tokens: TokenResolver | None,
    ) -> None:
        self._log = log_
        self._operator = operator_token
        self._window_start = -60.0
        self._unauthenticated = 0
        self._secret = mesh_secret
        self._tokens = tokens

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None or not changes(details.method):
            return handler
        md = _metadata(details)
        if self._audited_elsewhere(md):
            return handler
        inner = handler.unary_unary
        method = details.method.lstrip("/").rpartition(".")[2]  # "SessionAdminService/Kick..."

        async def call(request: Any, ctx: grpc.aio.ServicerContext) -> Any:
            outcome = "ok"
            try:
                return await inner(request, ctx)
            except BaseException:
                code = ctx.code()
                outcome = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
                raise
            finally:
                await self._record(md, method, request, _peer(ctx), outcome)

        return grpc.unary_unary_rpc_method_handler(
            call,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _audited_elsewhere(self, md: dict[str, str]) -> bool:
        if not md.get(AUDITED_BY_KEY):
            return False
        if self._secret is None:  # mesh_auth=disabled: every internal door is open anyway
            return True
        given = md.get(MESH_METADATA_KEY, "")
        return bool(self._secret) and hmac.compare_digest(given.encode(), self._secret.encode())

    def _over_budget(self, outcome: str) -> bool:
        """Whether this refusal for a missing or wrong token is past the minute's budget."""
        if outcome != grpc.StatusCode.UNAUTHENTICATED.name:
            return False
        now = time.monotonic()
        if now - self._window_start >= 60:  # a minute from the window's first refusal
            if self._unauthenticated > UNAUTHENTICATED_PER_MINUTE:
                skipped = self._unauthenticated - UNAUTHENTICATED_PER_MINUTE
                log.warning("admin_audit_refusals_skipped %s", skipped)
            self._window_start, self._unauthenticated = now, 0
        self._unauthenticated += 1
        return self._unauthenticated > UNAUTHENTICATED_PER_MINUTE

    async def _record(
        self, md: dict[str, str], method: str, request: Any, peer: str, outcome: str
    ) -> None:
        if self._over_budget(outcome):
            return
        try:
            record = AuditRecord(
                at_ms=now_ms(),
                actor=await self._actor(md.get("authorization", "")),
                tenant=tenant_of(request) or "",
                action=method,
                target=target_of(request),
                detail="grpc",
                address=peer,
                outcome=outcome,
                record_id=uuid.uuid4().hex,
            )
            await self._log.append(record)
        except Exception as exc:  # the change happened: its answer must not fail over this
            log.warning("admin_audit_failed", extra={"method": method, "error": str(exc)})

    async def _actor(self, authorization: str) -> str:
        token = authorization[7:] if authorization[:7].lower() == "bearer " else ""
        if not token:
            return "anonymous"
        if self._operator and hmac.compare_digest(token.encode(), self._operator.encode()):
            return "operator"
        if token.startswith(TENANT_TOKEN_PREFIX) and self._tokens is not None:
            grant = await self._tokens.resolve(token)
            if grant is not None:
                return f"tenant {grant.tenant} (token {grant.token_id})"
        return "unknown token"
