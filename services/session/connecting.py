"""The CONNECT flow of the session service, and the two steps that take turns with it per
client id: a connection's end (DISCONNECT) and a node's re-assertion of its connections.

Owns the per-client-id locks: CONNECT, DISCONNECT and re-assertion of one client id run one
after the other. Call `connect` with what the login admitted (services/session/login.py);
it answers `Connected` or `Refused`, which the servicer (services/session/api.py) turns into
protobuf. Invariant: every check that can refuse a CONNECT comes before anything is
installed, so a refused CONNECT never kicks the connection it would have displaced.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nats.aio.client import Client

from services.common.acl import AclRule, substitute
from services.common.clock import now_ms
from services.common.mqtt.reason import ReasonCode as RC
from services.common.refusals import Refusals
from services.common.store.ports_session import SessionRecord
from services.session.auth import Authenticator
from services.session.core import may_use
from services.session.events import Events
from services.session.fence import announce_loss
from services.session.gatekeeper import Gatekeeper
from services.session.kicks import kick_and_ask, send_kick
from services.session.locks import KeyedLocks
from services.session.login import Admission
from services.session.registry import ClaimResult, Holder, Registry
from services.session.sessions import UNREAD, Opened, Sessions, StaleConnectError, Unread, owner_of
from services.session.wills import StoredWills, displaced_will_due, kept_will

log = logging.getLogger(__name__)

TAKEN_OVER = "a newer connection holds the session"
# A node whose kick timed out and that has not beaten for this long is taken for dead.
NODE_SILENT_S = 2.5


def _never_silent(node_id: str) -> float:
    return 0.0


@dataclass(frozen=True, slots=True)
class ConnectRules:
    """The settings the flow applies."""

    acl_default_allow: bool
    max_connections_per_tenant: int = 0  # 0: no cap from the settings (the quota's still)
    shared_client_id_tenants: frozenset[str] = frozenset()  # "*": every tenant
    will_store_max_bytes: int = 0  # wills kept with registry entries, at most this big


@dataclass(frozen=True, slots=True)
class ConnectDeps:
    auth: Authenticator
    registry: Registry
    nc: Client
    events: Events
    sessions: Sessions
    refusals: Refusals
    gatekeeper: Gatekeeper | None = None
    # Wills kept with registry entries, published here when their node is gone.
    wills: StoredWills | None = None
    # Seconds since a node's last heartbeat (services/session/liveness.py).
    silent_for: Callable[[str], float] = _never_silent


@dataclass(frozen=True, slots=True)
class Attempt:
    """The CONNECT as the node sent it (what the login does not decide)."""

    client_id: str
    node_id: str
    peer_address: str
    protocol_level: int
    clean_start: bool
    session_expiry_s: int
    will: bytes = b""  # the will's envelope (b"": none)
    will_delay_s: int = 0


@dataclass(frozen=True, slots=True)
class Connected:
    epoch: int
    opened: Opened
    rules: list[AclRule]  # the connection's ACL, substituted, extra rules first


@dataclass(frozen=True, slots=True)
class Refused:
    code: int  # the CONNACK reason code
    reason: str
    epoch: int = 0  # the epoch the CONNECT had claimed when a newer connection won


@dataclass(frozen=True, slots=True)
class Ended:
    """A connection's end as its node reported it."""

    tenant: str
    client_id: str
    epoch: int
    node_id: str
    incarnation: int
    session_expiry_s: int | None  # from the DISCONNECT (None: the CONNECT's stands)
    qos2_fence: int


class Connecting:
    def __init__(self, *, deps: ConnectDeps, rules: ConnectRules) -> None:
        self._d = deps
        self._r = rules
        self._will_max_bytes = rules.will_store_max_bytes if deps.wills is not None else 0
        self._locks = KeyedLocks()  # CONNECT and DISCONNECT of one client id, in order

    @property
    def will_max_bytes(self) -> int:
        """Wills bigger than this are not kept with registry entries (0: none are)."""
        return self._will_max_bytes

    async def connect(self, admission: Admission, a: Attempt) -> Connected | Refused:
        """An admitted CONNECT: the ban list, then the claim and the session."""
        tenant, name = admission.tenant, admission.name
        if not a.client_id:
            return Refused(RC.CLIENT_IDENTIFIER_NOT_VALID, "client id required")
        if self._d.gatekeeper is not None:
            refused = await self._d.gatekeeper.check(tenant, a.client_id, name, a.peer_address)
            if refused:
                self._d.refusals.count("banned", tenant)
                return Refused(RC.BANNED, refused)
        # Whom the session belongs to: the authenticated user, or "" for an anonymous client
        # (whatever user name it gave).
        owner = name if admission.authenticated else ""
        acl = [*admission.acl, *await self._d.auth.acl(tenant)]
        rules = substitute(acl, name, a.client_id)
        will = kept_will(a.will, rules, self._r.acl_default_allow, self._will_max_bytes)
        async with self._locks.hold((tenant, a.client_id)):
            claimed = await self._claim_and_open(tenant, name, owner, a, will)
        if isinstance(claimed, Refused):
            return claimed
        epoch, opened = claimed
        await self._d.events.emit(
            tenant,
            a.client_id,
            "connected",
            username=name,
            peer_address=a.peer_address,
            protocol_level=a.protocol_level,
            clean_start=a.clean_start,
            epoch=epoch,
        )
        return Connected(epoch=epoch, opened=opened, rules=rules)

    async def _claim_and_open(
        self, tenant: str, name: str, owner: str, a: Attempt, will: str
    ) -> tuple[int, Opened] | Refused:
        """Check the client id is the user's to use, take a new registry epoch for it (within
        the tenant's connection cap), settle the connection it displaces, then open or resume
        the session.

        Round trips: one store read of the session record (the owner check, and the open
        unless a displaced connection's settlement changed it) and one registry script (the
        installed connection's owner check, the claim, the node's set)."""
        shared_ids = self._r.shared_client_id_tenants
        shared = "*" in shared_ids or tenant in shared_ids
        rec = await self._d.sessions.read(tenant, a.client_id)
        if not shared and not may_use(owner_of(rec), owner):
            return self._not_owner(tenant)
        # A persistent session (online or offline) counts against the tenant's max_sessions
        # from the CONNECT that opens it until it ends (services/session/sessions.py).
        persistent = min(a.session_expiry_s, self._d.sessions.max_expiry_s) > 0
        claim = await self._d.registry.claim(
            self._holder(tenant, name, owner, a, will),
            self._r.max_connections_per_tenant,
            check_owner=not shared,
            persistent=persistent,
        )
        if claim.generation:
            # The registry was empty: connections from before may still be live on their
            # nodes, unknown to it; they re-assert, and a copy of this client id is kicked.
            await announce_loss(self._d.nc, claim.generation)
        if claim.not_owner:
            return self._not_owner(tenant)
        if claim.quota or claim.full:
            return await self._over_quota(tenant, a.client_id, claim)
        if not claim.won:
            return Refused(RC.SESSION_TAKEN_OVER, TAKEN_OVER, epoch=claim.epoch)
        known: SessionRecord | Unread | None = rec
        prev = claim.previous
        if prev is not None and prev.epoch != claim.epoch:
            await self._settle_displaced(prev, a.clean_start)
            known = UNREAD  # the displaced connection's end may have changed the record
        return await self._open(tenant, owner, a, claim.epoch, known)

    def _holder(self, tenant: str, name: str, owner: str, a: Attempt, will: str) -> Holder:
        """The registry entry this CONNECT claims, under a new epoch."""
        return Holder(
            tenant,
            a.client_id,
            a.node_id,
            self._d.registry.next_epoch(),
            name,
            a.peer_address,
            a.protocol_level,
            now_ms(),
            a.clean_start,
            owner,
            will,
            # A Will Delay Interval never outlasts the session [MQTT-3.1.3-9].
            min(a.will_delay_s, a.session_expiry_s, self._d.sessions.max_expiry_s) if will else 0,
        )

    async def _over_quota(self, tenant: str, client_id: str, claim: ClaimResult) -> Refused:
        """A claim the tenant's (or user's) quota or the connection cap refused."""
        if claim.quota:
            self._d.refusals.count(claim.quota, tenant)
            await self._d.events.emit(tenant, client_id, "quota_exceeded", limit=claim.quota)
            what = "clients connected" if claim.quota != "max_sessions" else "sessions"
            whose = "user" if claim.quota == "max_connections_per_user" else "tenant"
            return Refused(
                RC.QUOTA_EXCEEDED, f"the {whose} has {claim.cap} {what} (quota {claim.quota})"
            )
        # The setting's cap or the tenant's quota (`starling quota set`), the lower one.
        cap = self._r.max_connections_per_tenant
        limit = "connections_per_tenant" if cap and claim.cap == cap else "max_connections"
        self._d.refusals.count(limit, tenant)
        await self._d.events.emit(tenant, client_id, "quota_exceeded", limit=limit)
        return Refused(RC.QUOTA_EXCEEDED, f"the tenant has {claim.cap} clients connected")

    async def _open(
        self, tenant: str, owner: str, a: Attempt, epoch: int, known: SessionRecord | Unread | None
    ) -> tuple[int, Opened] | Refused:
        try:
            opened = await self._d.sessions.open(
                tenant,
                a.client_id,
                a.clean_start,
                a.session_expiry_s,
                owner,
                known,
                epoch=epoch,
                current=lambda: self._holds(tenant, a.client_id, epoch),
            )
        except StaleConnectError as exc:
            return await self._stale(tenant, a, epoch, exc)
        return epoch, opened

    async def _stale(self, tenant: str, a: Attempt, epoch: int, exc: StaleConnectError) -> Refused:
        """A later connection took the client id while this CONNECT opened the session (on
        another instance): answered as if that one's claim had come first."""
        log.info("connect_stale", extra={"client_id": a.client_id, "why": str(exc)})
        # Its registry entry (and kept will) goes: no connection will hold it.
        await self._d.registry.end(tenant, a.client_id, epoch, a.node_id)
        return Refused(RC.SESSION_TAKEN_OVER, TAKEN_OVER, epoch=epoch)

    async def _holds(self, tenant: str, client_id: str, epoch: int) -> bool:
        """This connection's registry entry is still the client id's installed one."""
        holder = await self._d.registry.get(tenant, client_id)
        return holder is not None and holder.epoch == epoch

    def _not_owner(self, tenant: str) -> Refused:
        self._d.refusals.count("client_id_owner", tenant)
        return Refused(RC.NOT_AUTHORIZED, "the client id belongs to another user")

    async def _settle_displaced(self, prev: Holder, clean_start: bool) -> None:
        """Kick the connection a new one displaces; if it had already ended (its release is
        still on its way and will be refused), end the session as its DISCONNECT said before
        Session Present is decided. A node that does not answer is gone, and its will with
        it: published from here if it is due now (services/session/wills.py)."""
        reply, gone = await kick_and_ask(self._d.nc, prev, RC.SESSION_TAKEN_OVER)
        if prev.will and self._d.wills is not None:
            silent_s = self._d.silent_for(prev.node_id)
            # A node that timed out but still beats publishes the will itself when it gets
            # to the kick.
            if gone or (reply is None and silent_s >= NODE_SILENT_S):
                if displaced_will_due(prev, clean_start, silent_s):
                    self._d.wills.publish_now(prev)
        if reply is None or not reply.ended:
            await self._d.events.emit(prev.tenant, prev.client_id, "taken_over")
            return
        expiry = (
            reply.session_expiry_interval_s if reply.HasField("session_expiry_interval_s") else None
        )
        await self._d.sessions.ended(prev.tenant, prev.client_id, expiry, prev.epoch)

    async def disconnect(self, ended: Ended) -> bool:
        """A connection ended: its registry entry goes, and the session ends or is parked if
        it was still the session's holder. True when its entry was the installed one."""
        async with self._locks.hold((ended.tenant, ended.client_id)):
            code = await self._d.registry.end(
                ended.tenant, ended.client_id, ended.epoch, ended.node_id
            )
            # No entry at all (-1): the registry was lost while this connection lived (it
            # ended before its node re-asserted it), so it was still the session's holder.
            if code != 0:  # only the current holder may end or park the session
                await self._d.sessions.close(
                    ended.tenant,
                    ended.client_id,
                    ended.incarnation,
                    ended.session_expiry_s,
                    ended.qos2_fence,
                )
        await self._d.events.emit(ended.tenant, ended.client_id, "disconnected", epoch=ended.epoch)
        return code == 1

    async def reclaim(self, node_id: str, holders: Sequence[Holder]) -> tuple[int, int]:
        """A node re-asserts its live connections after the registry was lost: each is
        installed again unless a later connection holds its client id (then its node is
        kicked for it); one it displaces (an earlier epoch elsewhere) is kicked. Answers
        (reclaimed, superseded)."""
        reclaimed = superseded = 0
        for holder in holders:
            async with self._locks.hold((holder.tenant, holder.client_id)):
                claim = await self._d.registry.reclaim(holder)
            if not claim.won:
                superseded += 1
                await self._taken_over(holder)
                continue
            reclaimed += 1
            prev = claim.previous
            if prev is not None and prev.epoch != holder.epoch:
                await self._taken_over(prev)
        log.warning(
            "registry_reclaimed",
            extra={"node": node_id, "reclaimed": reclaimed, "superseded": superseded},
        )
        return reclaimed, superseded

    async def _taken_over(self, holder: Holder) -> None:
        await send_kick(self._d.nc, holder, RC.SESSION_TAKEN_OVER)
        await self._d.events.emit(holder.tenant, holder.client_id, "taken_over")
