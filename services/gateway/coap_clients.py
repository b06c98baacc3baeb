"""CoAP clients as clients of their tenants: who a request's URI queries say it is.

As EMQX's CoAP gateway: every request carries `clientid`, and either `username`
(`tenant/name`) and `password`, or (connection mode) the `token` that `POST
/mqtt/connection?clientid=..&username=..&password=..` answered. The first request of a
client id registers it with the session service (presence.py: a CONNECT on the gateway's
node id, the tenant's authenticators, bans and connection quota), so it appears in
`starling clients`, in events and in the tenant's connection count; later requests with the
same credentials reuse the registration (compared by hash). Other credentials for a
registered client id register it again (the session service takes the id over).

A client goes when its connection is deleted (`DELETE /mqtt/connection`), when another
connection takes its id over (a kick), or when it was idle (no request, no observation)
for `idle_s`. At most `max_clients` at once.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.common.acl import AclChecker
from services.common.clock import now_ms
from services.common.connect import ConnectOutcome
from services.common.tasks import TaskSet
from services.gateway.presence import LoginRefusedError, Presence
from services.gateway.stats import GatewayStats
from services.gateway.sys_notices import SysNotices
from starling.session.v1 import session_pb2

log = logging.getLogger("starling.gateway.coap_clients")


class ClientRefusedError(Exception):
    """`status` is the HTTP-like status (401, 403, 429, 503; the CoAP side maps it)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(eq=False)
class CoapClient:
    client_id: str
    tenant: str
    identity: str
    acl: AclChecker
    outcome: ConnectOutcome
    credentials: bytes  # hash of what registered it
    token: str
    last_seen: float
    peer: str
    connected_at_ms: int
    observers: set[object] = field(default_factory=set)
    on_close: list[Callable[[], None]] = field(default_factory=list)


class CoapClients:
    def __init__(
        self,
        *,
        presence: Presence,
        stats: GatewayStats,
        notices: SysNotices,
        max_clients: int,
        idle_s: float,
    ) -> None:
        self._presence = presence
        self._stats = stats
        self._notices = notices
        self._max = max_clients
        self._idle_s = idle_s
        self._clients: dict[str, CoapClient] = {}
        self._tasks = TaskSet()  # releases of kicked clients

    def __len__(self) -> int:
        return len(self._clients)

    async def identify(self, query: dict[str, str], address: str) -> CoapClient:
        """The client a request comes from, registered if it is new."""
        client_id = query.get("clientid", "")
        if not client_id:
            raise ClientRefusedError(400, "the clientid query is required")
        known = self._clients.get(client_id)
        if "token" in query:
            if known is None or not hmac.compare_digest(known.token, query["token"]):
                raise ClientRefusedError(401, "unknown connection token for this clientid")
            known.last_seen = time.monotonic()
            return known
        creds = _credentials(query)
        if known is not None and hmac.compare_digest(known.credentials, creds):
            known.last_seen = time.monotonic()
            return known
        return await self._register(client_id, query, address, creds)

    async def _register(
        self, client_id: str, query: dict[str, str], address: str, creds: bytes
    ) -> CoapClient:
        if client_id not in self._clients and len(self._clients) >= self._max:
            raise ClientRefusedError(503, "too many CoAP clients (gateway_coap_clients)")
        password = query.get("password")
        try:
            outcome = await self._presence.login(
                client_id=client_id,
                username=query.get("username", ""),
                password=None if password is None else password.encode(),
                peer=address,
            )
        except LoginRefusedError as refused:
            raise ClientRefusedError(refused.status, refused.reason) from None
        old = self._clients.pop(client_id, None)
        if old is not None:
            self._closed(old)
        client = CoapClient(
            client_id=client_id,
            tenant=outcome.tenant,
            identity=outcome.identity or query.get("username", ""),
            acl=AclChecker(list(outcome.acl), outcome.acl_default_allow),
            outcome=outcome,
            credentials=creds,
            token=secrets.token_urlsafe(16),
            last_seen=time.monotonic(),
            peer=address,
            connected_at_ms=now_ms(),
        )
        self._clients[client_id] = client
        self._stats.clients(client.tenant, 1)
        self._notices.connected(client.tenant, client_id, _name(client.identity), address)
        return client

    async def close(self, client: CoapClient, normal: bool = False) -> None:
        """The client is gone (`normal`: it said so, DELETE of its connection): its
        observations end, its registry entry is released."""
        if self._clients.get(client.client_id) is client:
            del self._clients[client.client_id]
            self._closed(client, normal)
            await self._presence.release(client.tenant, client.client_id, client.outcome)

    def kicked(self, tenant: str, client_id: str, epoch: int) -> bool:
        """Another connection took the client id over, or an admin kicked it: drop the
        client and release its entry (as a node does after closing a kicked connection;
        the registry refuses the release if a newer connection holds the id). Whether it
        was held here."""
        client = self._clients.get(client_id)
        if client is None or client.tenant != tenant:
            return False
        if epoch and client.outcome.epoch > epoch:
            return True
        del self._clients[client_id]
        self._closed(client)
        release = self._presence.release(tenant, client_id, client.outcome)
        self._tasks.spawn(release, "coap-release")
        return True

    def held(self) -> list[session_pb2.HeldConnection]:
        """Every registered client as the session registry holds it (re-asserted when the
        registry was lost: presence.py)."""
        return [
            session_pb2.HeldConnection(
                tenant=c.tenant,
                client_id=c.client_id,
                epoch=c.outcome.epoch,
                username=_name(c.identity),
                peer_address=c.peer,
                protocol_level=5,
                connected_at_ms=c.connected_at_ms,
                clean_start=True,
            )
            for c in self._clients.values()
        ]

    async def sweep(self) -> None:
        """Unregister the clients idle for `idle_s` (no request, no observation)."""
        now = time.monotonic()
        idle = [
            c
            for c in self._clients.values()
            if not c.observers and now - c.last_seen >= self._idle_s
        ]
        for client in idle:
            await self.close(client)

    async def close_all(self, within_s: float = 2.0) -> None:
        """Shutdown: every client goes, their releases sent together and waited for at
        most `within_s` (what is not released then, the gateway's next hello or its
        silence releases)."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            self._closed(client)
        releases = [self._presence.release(c.tenant, c.client_id, c.outcome) for c in clients]
        for release in releases:
            self._tasks.spawn(release, "coap-release")
        await self._tasks.wait(within_s)
        await self._tasks.cancel()

    def _closed(self, client: CoapClient, normal: bool = False) -> None:
        self._stats.clients(client.tenant, -1)
        self._notices.disconnected(client.tenant, client.client_id, _name(client.identity), normal)
        for callback in client.on_close:
            callback()
        client.on_close.clear()


def _name(identity: str) -> str:
    """The user name without its tenant (`acme/alice` -> `alice`)."""
    return identity.partition("/")[2] if "/" in identity else identity


def _credentials(query: dict[str, str]) -> bytes:
    text = f"{query.get('username', '')}\0{query.get('password', '')}"
    return hashlib.sha256(text.encode()).digest()
