"""The event log's values and arithmetic (no I/O): what one logged event is, how positions are
made and bucketed, how subscription options fit one column, and what a routing snapshot's
manifest says. Both stores (sqlite_session.py, cassandra_session.py) keep the log; the router
(services/router/boot.py) and the compaction (services/router/compaction.py and the
`routes-snapshot` Spark job) read it.

Positions: a 64-bit integer, `(ms since POSITION_EPOCH_MS) << SEQ_BITS` plus a sequence, so
they sort by time and a reader can turn one back into a wall-clock instant (and an hour
bucket). A writer takes `next_position(last, now)`: never below its previous one even if the
clock steps back. The embedded store assigns them inside the write transaction, so positions
grow in commit order; Cassandra writers put a per-process writer id in the low bits so two
processes never make the same position (`WRITER_BITS`).

Partitioning: (tenant, hour bucket of the position), so Cassandra spreads a busy log over
tenants and hours and an old hour is dropped as a whole partition. Pruning (after a routing
snapshot) records per tenant how far it went (`EventLog.pruned_through`): a reader behind
that has a gap and reloads the tenant from the snapshot (services/router/boot.py).

Several writers (Cassandra, several routers): a tenant's route events form a chain. Each
one's position is taken with a compare-and-set on the tenant's head (the last position
given), and its row names the position before it (`prev`). Positions of one tenant thus
grow in the order they were given, but rows can still land out of order (taken, then
written). A reader applies a tenant's events only along the chain: an event whose `prev` is
above what the reader holds and not in what it read is still on its way, and the reader
waits for it (`chained_prefix`), unless it is older than the settle delay (its writer died
between taking the position and writing the row: it never comes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from services.common.store.ports_session import SessionStore, SubscriptionRecord

POSITION_EPOCH_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z: 2^41 ms from it reach 2093
SEQ_BITS = 22  # positions per millisecond: 4M (1 << 12 per writer with WRITER_BITS)
WRITER_BITS = 10
BUCKET_MS = 3_600_000  # one partition per tenant and hour


class EventKind:
    """`LogEvent.kind` values. Subscription kinds change the route table; the rest are
    records for reports (retained messages, and the EVENTS stream's session and quota
    events)."""

    SUBSCRIBED = "subscribed"  # topic: the filter; options: encode_options()
    UNSUBSCRIBED = "unsubscribed"  # topic: the filter
    SESSION_DROPPED = "session_dropped"  # every subscription of (client_id, incarnation)
    RETAINED_SET = "retained_set"  # topic; options: the payload size in bytes
    RETAINED_CLEARED = "retained_cleared"  # topic
    # From the EVENTS stream (services/session/events.py): data is the serialized Event.
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"
    TAKEN_OVER = "taken_over"
    SESSION_EXPIRED = "session_expired"
    QUOTA_EXCEEDED = "quota_exceeded"
    MESSAGE_DROPPED = "message_dropped"


ROUTE_KINDS = frozenset({EventKind.SUBSCRIBED, EventKind.UNSUBSCRIBED, EventKind.SESSION_DROPPED})
STREAM_KINDS = frozenset(
    {
        EventKind.CONNECTED,
        EventKind.DISCONNECTED,
        EventKind.TAKEN_OVER,
        EventKind.SESSION_EXPIRED,
        EventKind.QUOTA_EXCEEDED,
        EventKind.MESSAGE_DROPPED,
    }
)


@dataclass(frozen=True, slots=True)
class LogEvent:
    """One row of the log. `position` is 0 until a store appended it."""

    tenant: str
    kind: str
    client_id: str = ""
    incarnation: int = 0
    topic: str = ""
    options: int = 0
    data: bytes = b""
    position: int = 0


def position_at(ms: int) -> int:
    """The smallest position of wall-clock millisecond `ms`."""
    return max(0, ms - POSITION_EPOCH_MS) << SEQ_BITS


def position_ms(position: int) -> int:
    """The wall-clock millisecond a position was made in."""
    return (position >> SEQ_BITS) + POSITION_EPOCH_MS


def next_position(last: int, now_ms: int, writer: int = 0) -> int:
    """The position after `last` for a writer whose low bits are `writer` (0 for the
    embedded store, whose transaction serializes writers): time-based, and above `last` even
    when the clock went back."""
    step = 1 << WRITER_BITS
    base = max(position_at(now_ms), (last | (step - 1)) + 1)
    return (base & ~(step - 1)) | writer


def chained_prefix(
    rows: list[tuple[LogEvent, int | None]], after: int, settled: int
) -> tuple[list[LogEvent], bool]:
    """The events of `rows` (by position, each with the position of its tenant's chained
    event before it, None for events outside the chain) that a reader who holds every event
    at or below `after` may apply now; and whether it stopped at an event whose predecessor
    is missing yet may still land (above `settled`, the position every write has settled
    by). `after` must be a position the reader holds exactly for each tenant: the last event
    of the tenant it applied, or a settled position with none of the tenant's events
    applied above it."""
    held: dict[str, int] = {}
    out: list[LogEvent] = []
    for e, prev in rows:
        if prev is not None:
            if prev > held.get(e.tenant, after) and prev > settled:
                return out, True
            held[e.tenant] = e.position
        out.append(e)
    return out, False


def bucket_of(position: int) -> int:
    """The hour bucket (hours since the Unix epoch) a position falls in."""
    return position_ms(position) // BUCKET_MS


def encode_options(s: SubscriptionRecord) -> int:
    """A subscription's options as one integer column: QoS (2 bits), no-local, retain as
    published, retain handling (2 bits), then the subscription identifier (28 bits)."""
    return (
        s.qos
        | int(s.no_local) << 2
        | int(s.retain_as_published) << 3
        | s.retain_handling << 4
        | s.subscription_identifier << 6
    )


def subscription_of(ev: LogEvent) -> SubscriptionRecord:
    """The subscription a SUBSCRIBED event set."""
    o = ev.options
    return SubscriptionRecord(
        ev.tenant,
        ev.client_id,
        ev.incarnation,
        ev.topic,
        o & 3,
        bool(o >> 2 & 1),
        bool(o >> 3 & 1),
        o >> 4 & 3,
        o >> 6,
    )


def subscribed(s: SubscriptionRecord) -> LogEvent:
    return LogEvent(
        s.tenant,
        EventKind.SUBSCRIBED,
        s.client_id,
        s.incarnation,
        s.topic_filter,
        encode_options(s),
    )


@dataclass(frozen=True, slots=True)
class SnapshotManifest:
    """A routing snapshot in force: every subscription as of `checkpoint` (events at or
    below it are in it; replaying the events above it over it gives the current table).
    `tenants` maps each tenant to its subscription count and part count."""

    snapshot_id: int
    checkpoint: int
    created_ms: int
    tenants: dict[str, tuple[int, int]]

    @property
    def subscriptions(self) -> int:
        return sum(n for n, _ in self.tenants.values())


class EventLog(Protocol):
    """The log and the routing snapshots, as both stores keep them (with the subscriptions:
    `SessionStore.put_subscriptions` and friends log their change in the same write)."""

    async def append_events(self, events: list[LogEvent]) -> int:
        """Append durably, in order; the last position given (0 for none)."""

    async def read_events(
        self, after: int, limit: int, tenant: str | None = None, kinds: frozenset[str] = ROUTE_KINDS
    ) -> list[LogEvent]:
        """Up to `limit` events of `kinds` above position `after` (of one tenant or all),
        by position."""

    async def stable_position(self) -> int:
        """A position at or below which no event can still appear: what a snapshot may take
        as its checkpoint."""

    async def prune_events(self, before: int) -> int:
        """Drop events at or below `before` (a stored snapshot's checkpoint): the embedded
        store drops exactly the route events at or below it, Cassandra the hour partitions
        wholly at or below it (both: other kinds by whole hours). Each tenant's
        `pruned_through` is raised before its events go. Rows removed (Cassandra:
        partitions)."""

    async def pruned_through(self, tenant: str | None = None) -> int:
        """The highest position of the tenant's route events (None: of any tenant's) that
        pruning removed; 0 when none was. A reader that holds the tenant's events only up to
        a lower position has lost some to pruning: it reloads the tenant from the snapshot
        (services/router/boot.py `gap`). Read after the events, it also covers a prune that
        ran while they were read."""

    async def put_snapshot(
        self, checkpoint: int, parts: dict[str, tuple[int, list[bytes]]]
    ) -> SnapshotManifest:
        """Store a snapshot (per tenant: its subscription count and encoded parts), then its
        manifest: only a complete snapshot ever comes into force. Older snapshots but the
        previous one are removed afterwards."""

    async def latest_snapshot(self) -> SnapshotManifest | None: ...

    async def snapshot_parts(self, snapshot_id: int, tenant: str) -> list[bytes]: ...


class LoggedSessionStore(SessionStore, EventLog, Protocol):
    """What `open_session_store` gives: the sessions store with its event log."""
