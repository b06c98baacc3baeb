"""The session store's port (`SessionStore`): persistent session records, their
subscriptions and their QoS 2 receiver state, kept by the session service (subscriptions also
read by the router and the nodes). Every backend passes the contract tests in
tests/common/test_store_contract.py and its session_qos2, session_listing and eventlog
siblings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

NEVER_EXPIRES = 0xFFFFFFFF  # MQTT 5 session expiry "never"; also 3.1.1 clean session 0


@dataclass(frozen=True, slots=True)
class SessionRecord:
    tenant: str
    client_id: str
    incarnation: int
    expiry_interval_s: int
    connected: bool
    disconnected_at_ms: int = 0
    # The user the session belongs to: the authenticated user name that created it, ""
    # for an anonymous client, None when unknown (written before owners were stored).
    owner: str | None = None
    # Raised above every earlier one by each connection that opens the persistent session
    # (Sessions.open), which stamps its QoS 2 receiver-state changes with it: what an earlier
    # connection still writes after that is ignored (Qos2Update.fence).
    qos2_fence: int = 0

    def expires_at_ms(self) -> int | None:
        if self.connected or self.expiry_interval_s == NEVER_EXPIRES:
            return None
        return self.disconnected_at_ms + self.expiry_interval_s * 1000


@dataclass(frozen=True, slots=True)
class SubscriptionRecord:
    tenant: str
    client_id: str
    incarnation: int
    topic_filter: str
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_identifier: int = 0

    @property
    def sub_ids(self) -> tuple[int, ...]:
        return (self.subscription_identifier,) if self.subscription_identifier else ()


class Qos2Change:
    """What happened to a QoS 2 publish a persistent session's client sent us."""

    RECEIVED = "received"  # PUBLISH taken: recorded before it is routed
    STORED = "stored"  # its routing finished (recorded when the connection ends)
    RELEASED = "released"  # PUBREL taken: forgotten before PUBCOMP


@dataclass(frozen=True, slots=True)
class Qos2Update:
    """One change to a session's QoS 2 receiver state (`Qos2Change`)."""

    tenant: str
    client_id: str
    incarnation: int
    change: str
    packet_id: int
    message_id: str = ""  # RECEIVED and STORED (a STORED for another message is ignored)
    # The fence of the connection that made the change (the session record's `qos2_fence`
    # when it opened the session). A RECEIVED or RELEASED below the record's fence (a later
    # connection opened the session since) or for an incarnation the record no longer has is
    # ignored; a STORED is always taken (it only marks the message it names). 0: never
    # fenced (a node from before fencing).
    fence: int = 0


@dataclass(frozen=True, slots=True)
class InboundQos2:
    """A QoS 2 publish received from the client and not released yet (PUBREL not taken)."""

    packet_id: int
    message_id: str
    stored: bool = False


class SessionStore(Protocol):
    """Persistent session records, their subscriptions and their QoS 2 receiver state."""

    async def get_session(self, tenant: str, client_id: str) -> SessionRecord | None: ...

    async def put_session(self, record: SessionRecord) -> None: ...

    async def replace_session(self, record: SessionRecord, expect: SessionRecord | None) -> bool:
        """Write `record` only if the stored one is still `expect` (None: there is none), as
        `get_session` returned it: same incarnation, fence, connected flag, expiry and
        disconnection time. False if another write came between (nothing written): several
        session service instances may handle one client id's CONNECT and DISCONNECT at once,
        and each decides from the record it read."""
        ...

    async def delete_session(self, tenant: str, client_id: str, incarnation: int) -> bool: ...

    async def expired_sessions(self, now_ms: int, limit: int = 1000) -> list[SessionRecord]: ...

    # The three subscription changes log themselves in the event log in the same durable
    # write (services/common/store/eventlog.py) and return the last log position they took.
    async def put_subscriptions(self, subs: list[SubscriptionRecord]) -> int: ...

    async def delete_subscriptions(
        self, tenant: str, client_id: str, incarnation: int, filters: list[str]
    ) -> int: ...

    async def list_subscriptions(
        self, tenant: str, client_id: str, incarnation: int
    ) -> list[SubscriptionRecord]: ...

    async def all_subscriptions(self) -> list[SubscriptionRecord]: ...

    async def subscriptions_as_of(self) -> tuple[int, list[SubscriptionRecord]]:
        """Every subscription, and a log position P such that replaying the logged changes
        above P over them gives the current subscriptions (the changes at or below P are in
        them)."""

    async def drop_subscriptions(self, tenant: str, client_id: str, incarnation: int) -> int: ...

    async def record_qos2(self, updates: list[Qos2Update]) -> None:
        """Apply `updates` (of any sessions) in order, durably, before returning."""

    async def list_qos2(self, tenant: str, client_id: str, incarnation: int) -> list[InboundQos2]:
        """The session's QoS 2 publishes awaiting PUBREL, by packet id."""

    async def drop_qos2(self, tenant: str, client_id: str, incarnation: int) -> None: ...

    async def close(self) -> None: ...
