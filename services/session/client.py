"""Typed clients of the session service: `SessionClient` for connection nodes (CONNECT and
disconnect), `SessionAdminClient` for operators (users, ACLs, clients, kick).

`connect` answers with a `ConnectOutcome` the channel uses as is: a refusal is a CONNACK reason
code, never an exception. Exceptions (services/common/rpc/errors.py) mean the session service
could not answer; the node then refuses with 0x88 Server unavailable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from nats.aio.client import Client

from services.common.acl import AclRule
from services.common.bus import unary
from services.common.bus.unary import UnaryClient
from services.common.connect import ConnectAttempt, ConnectOutcome, ReauthAttempt
from services.common.rpc.client import LazyStub
from services.common.rpc.errors import UnavailableError
from services.common.rpc.limits import BATCH_BYTES, split_by_bytes
from services.common.store.ports_session import Qos2Change, Qos2Update
from services.common.tasks import TaskSet
from services.session.acl_codec import rule_from_pb, rule_to_pb
from services.session.connect_client import connect_outcome, connect_request, reauth_outcome
from services.session.offline import OfflineSession as OfflineSession
from services.session.offline import SessionPage as SessionPage
from starling.session.v1 import session_pb2 as pb
from starling.session.v1 import session_pb2_grpc as pb_grpc

RECLAIM_BATCH = 1000  # connections per Reclaim call; the session service refuses more
CONNECT_BATCH = 64  # CONNECTs per ConnectMany call; the session service refuses more
# While a CONNECT call is in flight, new CONNECTs wait for its answer (or this long, at most)
# and then go together: under load the calls grow to many CONNECTs each instead of one per
# event-loop turn, and an idle node's lone CONNECT still goes at once. Bounded so that one
# slow call (a takeover waiting for a hung node's kick reply) does not hold back the rest.
CONNECT_LINGER_S = 0.002

_QOS2_CHANGES = {
    Qos2Change.RECEIVED: pb.QOS2_CHANGE_RECEIVED,
    Qos2Change.STORED: pb.QOS2_CHANGE_STORED,
    Qos2Change.RELEASED: pb.QOS2_CHANGE_RELEASED,
}


_PendingConnect = tuple[pb.ConnectRequest, "asyncio.Future[pb.ConnectResponse]"]


def _held_size(c: pb.HeldConnection) -> int:
    return c.ByteSize() + 8  # and its field tag and length in the request


class SessionClient:
    def __init__(self, address: str, timeout_s: float = 5.0) -> None:
        self._rpc = LazyStub(address, pb_grpc.SessionServiceStub, timeout_s=timeout_s)
        self._timeout_s = timeout_s
        self._bus: UnaryClient | None = None
        self._connect_subject = self._connect_many_subject = self._disconnect_subject = ""
        self._connects: list[_PendingConnect] = []  # asked for, not sent yet
        self._sending: asyncio.Handle | None = None  # the scheduled `_send_connects`
        self._in_flight = 0  # CONNECT calls sent and not answered yet
        self._tasks = TaskSet()

    def use_bus(self, nc: Client, subject: str = "svc.session") -> None:
        """Send `connect` and `disconnect` over NATS request/reply on `subject`.connect and
        .disconnect from now on (gRPC for what does not fit one NATS message):
        services/common/bus/unary.py says why."""
        self._bus = UnaryClient(nc, self._timeout_s)
        self._connect_subject = subject + unary.CONNECT_SUFFIX
        self._connect_many_subject = subject + unary.CONNECT_MANY_SUFFIX
        self._disconnect_subject = subject + unary.DISCONNECT_SUFFIX

    async def connect(self, attempt: ConnectAttempt) -> ConnectOutcome:
        """Authenticate, claim the client id in the registry, open or resume the session.

        Over NATS, CONNECTs go together as one ConnectMany call (a reconnect storm: one
        message each way instead of one per client): those asked for in one event-loop turn,
        and, while a call is in flight, those asked for until it is answered (at most
        CONNECT_LINGER_S); a lone one as Connect. A reply too large for one NATS message (a
        resumed session with megabytes of subscriptions) is asked for again over gRPC: the
        second Connect takes the client id again under a later epoch, as a quick reconnect
        of the same client would."""
        req = connect_request(attempt)
        if self._bus is None:
            return connect_outcome(await self._rpc.call(self._rpc.stub.Connect, req))
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[pb.ConnectResponse] = loop.create_future()
        self._connects.append((req, answer))
        if len(self._connects) >= CONNECT_BATCH:
            self._send_soon()
        elif self._sending is None:
            if self._in_flight:
                self._sending = loop.call_later(CONNECT_LINGER_S, self._send_connects)
            else:
                self._sending = loop.call_soon(self._send_connects)
        return connect_outcome(await answer)

    def _send_soon(self) -> None:
        """Send what waits at the end of this loop turn (instead of after the linger)."""
        if self._sending is not None:
            self._sending.cancel()
        self._sending = asyncio.get_running_loop().call_soon(self._send_connects)

    def _send_connects(self) -> None:
        self._sending = None
        pending, self._connects = self._connects, []
        for i in range(0, len(pending), CONNECT_BATCH):
            self._in_flight += 1
            self._tasks.spawn(self._connect_many(pending[i : i + CONNECT_BATCH]), "connects")

    async def _connect_many(self, calls: list[_PendingConnect]) -> None:
        try:
            if len(calls) == 1:
                answers = [await self._connect_one(calls[0][0])]
            else:
                answers = await self._connect_batch([req for req, _ in calls])
        except Exception as exc:  # the service did not answer: every CONNECT of the call
            for _, answer in calls:
                if not answer.done():
                    answer.set_exception(exc)
            return
        finally:
            self._in_flight -= 1
            if self._connects:  # they waited for this answer: they go now
                self._send_soon()
        for (_, answer), resp in zip(calls, answers, strict=True):
            if not answer.done():  # its caller may have given up
                answer.set_result(resp)

    async def _connect_one(self, req: pb.ConnectRequest) -> pb.ConnectResponse:
        return await unary.call(
            self._bus,
            self._connect_subject,
            self._rpc,
            self._rpc.stub.Connect,
            req,
            pb.ConnectResponse,
        )

    async def _connect_batch(self, reqs: list[pb.ConnectRequest]) -> list[pb.ConnectResponse]:
        many = pb.ConnectManyRequest(requests=reqs)
        assert self._bus is not None
        if not self._bus.fits(many.ByteSize()):  # large credentials or wills: in halves
            if len(reqs) == 1:
                return [await self._connect_one(reqs[0])]
            half = len(reqs) // 2
            first, second = await asyncio.gather(
                self._connect_batch(reqs[:half]), self._connect_batch(reqs[half:])
            )
            return first + second
        try:
            data = await self._bus.call(self._connect_many_subject, many.SerializeToString())
        except unary.ReplyTooLargeError:  # over gRPC: the same CONNECTs again, see `connect`
            resp = await self._rpc.call(self._rpc.stub.ConnectMany, many)
        else:
            resp = pb.ConnectManyResponse.FromString(data)
        if len(resp.responses) != len(reqs):
            raise UnavailableError(f"{len(resp.responses)} answers to {len(reqs)} CONNECTs")
        return list(resp.responses)

    async def reauthenticate(self, attempt: ReauthAttempt) -> ConnectOutcome:
        """One step of re-authentication of a live connection."""
        req = pb.ReauthenticateRequest(
            tenant=attempt.tenant,
            username=attempt.identity,
            client_id=attempt.client_id,
            peer_address=attempt.peer_address,
            auth_method=attempt.auth_method,
            auth_data=attempt.auth_data,
            auth_state=attempt.auth_state,
        )
        return reauth_outcome(await self._rpc.call(self._rpc.stub.Reauthenticate, req))

    async def disconnect(
        self,
        tenant: str,
        client_id: str,
        epoch: int,
        node_id: str,
        incarnation: int,
        expiry_s: int | None,
        fence: int = 0,
    ) -> bool:
        """Release the registry entry of this connection (`epoch`) and end or park its session
        (`expiry_s`: the Session Expiry Interval at disconnect; None keeps CONNECT's) if its
        record still has this connection's QoS 2 `fence`.
        False: a newer connection holds the client id (nothing released)."""
        req = pb.DisconnectRequest(
            tenant=tenant,
            client_id=client_id,
            epoch=epoch,
            node_id=node_id,
            incarnation=incarnation,
            qos2_fence=fence,
        )
        if expiry_s is not None:
            req.session_expiry_interval_s = expiry_s
        resp = await unary.call(
            self._bus,
            self._disconnect_subject,
            self._rpc,
            self._rpc.stub.Disconnect,
            req,
            pb.DisconnectResponse,
        )
        return bool(resp.removed)

    async def record_qos2(self, updates: Sequence[Qos2Update]) -> None:
        """QoS 2 receiver state changes of persistent sessions; durable once this returns."""
        req = pb.RecordQos2Request(
            updates=[
                pb.Qos2Update(
                    tenant=u.tenant,
                    client_id=u.client_id,
                    incarnation=u.incarnation,
                    change=_QOS2_CHANGES[u.change],
                    packet_id=u.packet_id,
                    message_id=u.message_id,
                    fence=u.fence,
                )
                for u in updates
            ]
        )
        await self._rpc.call(self._rpc.stub.RecordQos2, req)

    async def reclaim(self, node_id: str, held: Sequence[pb.HeldConnection]) -> tuple[int, int]:
        """Re-assert this node's live connections after the registry was lost, in calls of
        at most RECLAIM_BATCH and BATCH_BYTES (their wills make them large); returns
        (re-installed, superseded: kicked by the service)."""
        reclaimed = superseded = 0
        for run in split_by_bytes(held, _held_size, BATCH_BYTES, RECLAIM_BATCH):
            req = pb.ReclaimRequest(node_id=node_id, connections=run)
            resp = await self._rpc.call(self._rpc.stub.Reclaim, req)
            reclaimed += resp.reclaimed
            superseded += resp.superseded
        return reclaimed, superseded

    async def close(self) -> None:
        if self._sending is not None:
            self._sending.cancel()
        await self._tasks.cancel()
        await self._rpc.close()


@dataclass(frozen=True, slots=True)
class ClientInfo:
    """A connected client as the session registry knows it."""

    tenant: str
    client_id: str
    username: str
    node_id: str
    peer_address: str
    protocol_level: int
    connected_at_ms: int
    epoch: int
    clean_start: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientsPage:
    clients: tuple[ClientInfo, ...]
    total: int  # how many matched (the page is a slice of them)


class SessionAdminClient:
    """Users, ACLs and connected clients of a tenant (the admin token is required)."""

    def __init__(self, address: str, token: str, timeout_s: float = 10.0) -> None:
        self._rpc = LazyStub(
            address, pb_grpc.SessionAdminServiceStub, timeout_s=timeout_s, token=token
        )

    async def create_user(
        self,
        tenant: str,
        username: str,
        password: str,
        hash_scheme: str = "argon2",
        credentials: Sequence[str] = (),
    ) -> None:
        """Create or replace a user; `hash_scheme` is "argon2" or "bcrypt"; `credentials`
        which to store: "hash", "scram-sha-256", "scram-sha-512" (empty: all three)."""
        req = pb.CreateUserRequest(
            tenant=tenant,
            username=username,
            password=password,
            hash_scheme=hash_scheme,
            credentials=list(credentials),
        )
        await self._rpc.call(self._rpc.stub.CreateUser, req)

    async def delete_user(self, tenant: str, username: str) -> bool:
        req = pb.DeleteUserRequest(tenant=tenant, username=username)
        resp = await self._rpc.call(self._rpc.stub.DeleteUser, req)
        return bool(resp.deleted)

    async def set_acl(self, tenant: str, rules: Sequence[AclRule]) -> None:
        """Replace the tenant's ACL; `InvalidArgumentError` names a bad rule (rules[i])."""
        req = pb.SetAclRequest(tenant=tenant, rules=[rule_to_pb(r) for r in rules])
        await self._rpc.call(self._rpc.stub.SetAcl, req)

    async def get_acl(self, tenant: str) -> list[AclRule]:
        resp = await self._rpc.call(self._rpc.stub.GetAcl, pb.GetAclRequest(tenant=tenant))
        return [rule_from_pb(r) for r in resp.rules]

    async def list_clients(self, tenant: str) -> list[ClientInfo]:
        return list((await self.clients_page(tenant)).clients)

    async def clients_page(
        self, tenant: str, *, query: str = "", offset: int = 0, limit: int = 0, client_id: str = ""
    ) -> ClientsPage:
        """The tenant's connected clients whose id, user or address contains `query`, by
        client id: `offset` skipped, at most `limit` (0: all), and how many matched; with
        `client_id`, only that client (if connected)."""
        req = pb.ListClientsRequest(
            tenant=tenant, query=query, offset=offset, limit=limit, client_id=client_id
        )
        resp = await self._rpc.call(self._rpc.stub.ListClients, req)
        clients = [
            ClientInfo(
                c.tenant,
                c.client_id,
                c.username,
                c.node_id,
                c.peer_address,
                c.protocol_level,
                c.connected_at_ms,
                c.epoch,
                c.clean_start,
            )
            for c in resp.clients
        ]
        return ClientsPage(clients=tuple(clients), total=resp.total)

    async def list_sessions(
        self, tenant: str, *, prefix: str = "", after: str = "", limit: int = 0
    ) -> SessionPage:
        """A page of the tenant's offline persistent sessions by client id, with their queue
        depths; pass the page's `next` as `after` for the next one."""
        req = pb.ListSessionsRequest(
            tenant=tenant, client_id_prefix=prefix, after=after, limit=limit
        )
        resp = await self._rpc.call(self._rpc.stub.ListSessions, req)
        return SessionPage(
            sessions=tuple(
                OfflineSession(
                    client_id=s.client_id,
                    owner=s.owner,
                    incarnation=s.incarnation,
                    disconnected_at_ms=s.disconnected_at_ms,
                    expires_at_ms=s.expires_at_ms,
                    queue_depth=s.queue_depth if s.queue_depth_known else None,
                )
                for s in resp.sessions
            ),
            next=resp.next,
        )

    async def discard_session(self, tenant: str, client_id: str) -> bool:
        """End the client id's offline session (subscriptions and queue dropped); False if
        it has none or is connected."""
        req = pb.DiscardSessionRequest(tenant=tenant, client_id=client_id)
        return bool((await self._rpc.call(self._rpc.stub.DiscardSession, req)).discarded)

    async def kick(self, tenant: str, client_id: str) -> None:
        """Disconnect the client (DISCONNECT 0x98) on whatever node holds it; raises
        `NotFoundError` when it is not connected."""
        req = pb.KickClientRequest(tenant=tenant, client_id=client_id)
        await self._rpc.call(self._rpc.stub.KickClient, req)

    async def close(self) -> None:
        await self._rpc.close()
