"""Storage interfaces shared by services. Every backend (embedded SQLite, Cassandra) passes the
same contract tests in tests/common/test_store_contract.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from services.common.acl import AclRule
from services.common.bans import Ban, BanKind


@dataclass(frozen=True, slots=True)
class UserRecord:
    tenant: str
    username: str
    password_hash: str


class AuthStore(Protocol):
    """Users and ACLs per tenant."""

    async def get_user(self, tenant: str, username: str) -> UserRecord | None: ...

    async def put_user(self, user: UserRecord) -> None: ...

    async def delete_user(self, tenant: str, username: str) -> bool: ...

    async def get_acl(self, tenant: str) -> list[AclRule]: ...

    async def set_acl(self, tenant: str, rules: list[AclRule]) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class AdminTokenRecord:
    """A tenant-scoped admin token as stored: its SHA-256, never the token itself."""

    token_id: str
    tenant: str
    token_hash: str
    created_at_ms: int
    expires_at_ms: int = 0  # 0: never
    description: str = ""

    def expired(self, now_ms: int) -> bool:
        return self.expires_at_ms != 0 and now_ms >= self.expires_at_ms


class AdminTokenStore(Protocol):
    """Tenant-scoped admin tokens (issue 12), kept by the session service."""

    async def put_token(self, record: AdminTokenRecord) -> None: ...

    async def get_token(self, token_id: str) -> AdminTokenRecord | None: ...

    async def list_tokens(self, tenant: str | None = None) -> list[AdminTokenRecord]:
        """Every token, or those of `tenant`, ordered by creation."""

    async def delete_token(self, token_id: str) -> bool: ...

    async def close(self) -> None: ...


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


@dataclass(frozen=True, slots=True)
class NewQueueItem:
    message_id: str
    qos: int
    data: bytes  # serialized starling.queue.v1.QueueEntry without seq
    expires_at_ms: int = 0  # 0: never


# A queue's entries are bucketed by seq >> BUCKET_BITS (the Cassandra partition key; SQLite
# keeps the same column so both stores hold the same rows).
BUCKET_BITS = 16


def entry_row(
    tenant: str, queue_id: str, seq: int, item: NewQueueItem
) -> tuple[str, str, int, int, str, int, bytes, int]:
    """The columns of one queue entry, in table order, as both stores write them."""
    return (
        tenant,
        queue_id,
        seq >> BUCKET_BITS,
        seq,
        item.message_id,
        item.qos,
        item.data,
        item.expires_at_ms,
    )


@dataclass(frozen=True, slots=True)
class StoredEntry:
    seq: int
    qos: int
    data: bytes
    expires_at_ms: int
    released: bool


class AppendOutcome:
    OK = "ok"
    DUPLICATE = "duplicate"  # same message_id already in the queue: not appended again
    FULL = "full"  # reject-newest policy at the depth limit
    FENCED = "fenced"  # another instance owns the partition now
    OVER_BYTES = "over_bytes"  # the tenant's max_queued_bytes: no room left (not stored)


@dataclass(frozen=True, slots=True)
class AppendReport:
    """What one append did: an `AppendOutcome` per item, the queue's last seq after it, how
    many entries the depth limit dropped (oldest removed or newest refused), and how much the
    queue's depth and held bytes changed (its counters after minus before, in the append's
    transaction)."""

    outcomes: list[str]
    last_seq: int = 0
    dropped: int = 0
    depth_change: int = 0
    bytes_change: int = 0  # the same for the queue's held bytes (`QueueState.bytes`)


class QueueChange(NamedTuple):
    """How much a write changed a queue's counters (after minus before, in its transaction):
    entries and held bytes."""

    depth: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class QueueState:
    last_seq: int
    acked_through: int
    depth: int
    dropped: int
    # The highest seq ever handed to a connection for delivery: entries above it have never
    # been sent, so their first PUBLISH carries DUP=0 [MQTT-3.3.1-1].
    delivered_through: int = 0
    # The bytes the queue holds for its readers: the sum of its unacknowledged entries'
    # `NewQueueItem.data` lengths (the tenant's max_queued_bytes counts these).
    bytes: int = 0


class QueueStore(Protocol):
    """Ordered per-session queues under single-writer partitions with a fencing epoch."""

    async def claim_partition(self, partition: int) -> int:
        """Become the owner of `partition`; returns the new epoch (older owners are fenced)."""

    async def append(
        self,
        tenant: str,
        queue_id: str,
        items: list[NewQueueItem],
        partition: int,
        epoch: int,
        max_depth: int,
        drop_oldest: bool,
        mark_delivered: bool = False,
        room_bytes: int | None = None,
    ) -> AppendReport:
        """Append in order, in one transaction. `room_bytes` (None: no cap): the bytes the
        tenant may still queue; a new entry whose data would take the appended ones past it
        is OVER_BYTES (not stored; duplicates take no room). With `mark_delivered` (the queue
        pushes the new entries to a reader) delivered_through is raised to the new last seq,
        durably, before this returns."""

    async def read(
        self,
        tenant: str,
        queue_id: str,
        from_seq: int,
        limit: int,
        mark_delivered: bool = False,
        max_bytes: int = 0,
    ) -> tuple[list[StoredEntry], QueueState]:
        """Up to `limit` entries from `from_seq` on (expired ones included), whose data add
        up to at most `max_bytes` (0: no cap; the first entry always comes, however large,
        so a big entry still moves), and the queue's
        state from BEFORE this read. With `mark_delivered`, delivered_through is raised to the
        last entry returned, durably, before this returns: the caller writes the entries only
        afterwards, so a later reader never takes an entry that was sent for a first attempt."""

    async def ack(self, tenant: str, queue_id: str, through_seq: int) -> QueueChange:
        """Acknowledge the entries up to `through_seq`; returns the change of the queue's
        depth and bytes (<= 0)."""

    async def mark_released(self, tenant: str, queue_id: str, seq: int) -> None: ...

    async def drop(self, tenant: str, queue_id: str) -> QueueChange:
        """Remove the whole queue; returns the change of depth and bytes (minus what it
        held)."""

    async def depths(self) -> list[tuple[str, str, int, int]]:
        """(tenant, queue id, depth, bytes) of every queue holding entries: one scan of the
        queues' state, for the per-tenant totals the queue service keeps (at start, and now
        and then to take in what others changed: compaction, an ack served by a non-owner)."""

    async def state(self, tenant: str, queue_id: str) -> QueueState: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RetainedRecord:
    tenant: str
    topic: str
    data: bytes  # serialized starling.common.v1.RoutedMessage
    expires_at_ms: int = 0  # 0: never


@dataclass(frozen=True, slots=True)
class DelayedRecord:
    id: str
    tenant: str
    due_ms: int
    data: bytes  # serialized RoutedMessage, topic already without the $delayed prefix


class RouterStore(Protocol):
    """Retained messages and delayed publishes (owned by the router)."""

    async def put_retained(self, rec: RetainedRecord) -> None: ...

    async def delete_retained(self, tenant: str, topic: str) -> bool: ...

    async def all_retained(self) -> list[RetainedRecord]: ...

    async def tenant_retained(self, tenant: str) -> list[RetainedRecord]:
        """One tenant's retained messages (a router of several instances reloads them)."""
        ...

    async def put_delayed(self, rec: DelayedRecord) -> None: ...

    async def delete_delayed(self, tenant: str, id: str) -> bool: ...

    async def all_delayed(self) -> list[DelayedRecord]: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RuleRecord:
    """A tenant's rule as stored (issue 17): its SQL and actions, compiled by each rules
    service instance that loads it. `actions_json` is a JSON list of {"kind", "params"}."""

    tenant: str
    rule_id: str
    sql: str
    actions_json: str
    enabled: bool
    created_at_ms: int
    updated_at_ms: int
    description: str = ""


class RuleStore(Protocol):
    """Rules per tenant, kept by the rules service."""

    async def put_rule(self, record: RuleRecord) -> None: ...

    async def get_rule(self, tenant: str, rule_id: str) -> RuleRecord | None: ...

    async def list_rules(self, tenant: str | None = None) -> list[RuleRecord]:
        """Every rule, or those of `tenant`, ordered by (tenant, rule_id)."""

    async def delete_rule(self, tenant: str, rule_id: str) -> bool: ...

    async def put_auto_subscription(self, tenant: str, filter: str, qos: int) -> None:
        """Add (or set the QoS of) one of `tenant`'s auto-subscription filters."""

    async def delete_auto_subscription(self, tenant: str, filter: str) -> bool: ...

    async def list_auto_subscriptions(
        self, tenant: str | None = None
    ) -> list[tuple[str, str, int]]:
        """(tenant, filter, qos) of every tenant's, or `tenant`'s, ordered by tenant, filter."""

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class UsageDelta:
    """What one reporter added for one tenant in one hour since its previous report (a row
    of the `usage` table holds the sum of these, `connections` as the hour's maximum)."""

    tenant: str
    hour_ms: int  # start of the hour, epoch ms
    node_id: str
    connections: int  # open at the report
    connection_ms: int
    messages_in: int
    messages_out: int
    dropped: int
    msgs_in_q0: int = 0
    msgs_in_q1: int = 0
    msgs_in_q2: int = 0
    msgs_out_q0: int = 0
    msgs_out_q1: int = 0
    msgs_out_q2: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    quota_refusals: int = 0


# The `usage` columns summed from deltas, in table order after the key and connections_max.
USAGE_SUMMED = (
    "connection_ms",
    "messages_in",
    "messages_out",
    "dropped",
    "msgs_in_q0",
    "msgs_in_q1",
    "msgs_in_q2",
    "msgs_out_q0",
    "msgs_out_q1",
    "msgs_out_q2",
    "bytes_in",
    "bytes_out",
    "quota_refusals",
)


@dataclass(frozen=True, slots=True)
class TopicDelta:
    """Messages a tenant published to a topic within one hour, as estimated by one report's
    top-topics summary (a row of `usage_topics` holds their sum over reporters)."""

    tenant: str
    hour_ms: int
    topic: str
    messages: int


class UsageStore(Protocol):
    """Per-tenant hourly usage, written by the metrics service, read by analytics."""

    async def add(self, deltas: Sequence[UsageDelta], topics: Sequence[TopicDelta] = ()) -> None:
        """Add to the rows (created at zero when missing); `connections` raises the row's
        `connections_max`."""

    async def usage(self, tenant: str) -> list[UsageDelta]:
        """The tenant's rows (connections = connections_max), by hour and reporter."""

    async def topics(self, tenant: str) -> list[TopicDelta]:
        """The tenant's `usage_topics` rows, by hour and topic."""

    async def close(self) -> None: ...


class BanStore(Protocol):
    """The ban list, written by the quota service (every instance sees the same list) and
    read by nodes and session services through it. Expired bans are never listed."""

    async def put(self, ban: Ban, max_bans: int) -> bool:
        """Add or replace `ban`; False (nothing written) when it is new and `max_bans` bans
        are in force."""

    async def remove(self, kind: BanKind, tenant: str, value: str) -> bool:
        """True when the ban existed."""

    async def list(self) -> list[Ban]:
        """Every ban in force, oldest first."""

    async def close(self) -> None: ...
