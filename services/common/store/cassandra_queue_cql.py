"""The queue tables of the Cassandra store: their migrations, the CQL of every statement the
queue store and its compaction issue, and the row helpers they share.

One partition per queue, `queue_log ((tenant, queue_id), seq, mid)`. The queue's state
(owner epoch, version, last seq, acked through, depth, dropped, delivered through, byte
offsets) is in STATIC columns, so the fence and the data it protects are one conditional
batch: an append writes its entries (seq >= 1, mid '') and their message ids (seq 0, mid =
the message id, kept MSGID_TTL_S like the embedded store's MSGID_RETENTION_MS) in the same
lightweight transaction that checks and advances the state. Every write to the table is a
lightweight transaction (LWT and plain writes never meet on a row), except the range deletes
and row deletes that travel inside those conditional batches. docs/storage.md has the sizes,
tombstones and consistency levels.
"""

from __future__ import annotations

from typing import Any

from services.common.store.cassandra_schema import AddColumn, Migration
from services.common.store.ports_queue import QueueState

BACKSTOP_TTL_S = 30 * 24 * 3600  # entries: a backstop, acks and compaction remove them first
MSGID_TTL_S = 15 * 60  # as the embedded store's MSGID_RETENTION_MS
MAX_CAS_TRIES = 64  # compare-and-set rounds of one change against concurrent writers
TAKE_AT_ONCE = 32  # queues a claim takes concurrently
CHUNK_ITEMS = 100  # items per conditional batch of an append
CHUNK_BYTES = 1 << 20  # data bytes per conditional batch (far below max_mutation_size)

STATICS = (
    "fence, owner_epoch, version, last_seq, acked_through, depth, dropped, delivered_through, "
    "appended_bytes, acked_bytes"
)

MIGRATIONS = [
    Migration(
        1,
        "queue entries, state, message ids, partition owners",
        (
            """CREATE TABLE IF NOT EXISTS queue_entries (
             tenant text, queue_id text, bucket bigint, seq bigint, message_id text, qos int,
             data blob, expires_at_ms bigint, released boolean,
             PRIMARY KEY ((tenant, queue_id, bucket), seq))
           WITH CLUSTERING ORDER BY (seq ASC)""",
            """CREATE TABLE IF NOT EXISTS queue_state (
             tenant text, queue_id text, last_seq bigint, acked_through bigint, depth bigint,
             dropped bigint, owner_epoch bigint, delivered_through bigint,
             PRIMARY KEY ((tenant, queue_id)))""",
            """CREATE TABLE IF NOT EXISTS queue_msgids (
             tenant text, queue_id text, message_id text, seq bigint,
             PRIMARY KEY ((tenant, queue_id), message_id))
           WITH default_time_to_live = 2592000""",
            "CREATE TABLE IF NOT EXISTS partition_owner (partition int PRIMARY KEY, epoch bigint)",
        ),
    ),
    Migration(
        2,
        "queue_state.delivered_through",
        (AddColumn("queue_state", "delivered_through", "bigint"),),
    ),
    Migration(3, "queue_state.version", (AddColumn("queue_state", "version", "bigint"),)),
    Migration(
        4,
        "partition_queues",
        (
            """CREATE TABLE IF NOT EXISTS partition_queues (
             partition int, tenant text, queue_id text,
             PRIMARY KEY ((partition), tenant, queue_id))""",
        ),
    ),
    Migration(
        5,
        "queue bytes offsets",
        (
            AddColumn("queue_state", "appended_bytes", "bigint"),
            AddColumn("queue_state", "acked_bytes", "bigint"),
            AddColumn("queue_entries", "end_bytes", "bigint"),
            AddColumn("queue_entries", "size", "bigint"),
        ),
    ),
    # Issue 36: state and entries in one partition (module docstring). The tables of
    # migrations 1-5 stay for a keyspace that has them; docs/storage.md says how to move.
    Migration(
        6,
        "queue_log: state as static columns, entries and message ids in one partition",
        (
            """CREATE TABLE IF NOT EXISTS queue_log (
             tenant text, queue_id text, seq bigint, mid text,
             fence bigint static, owner_epoch bigint static, version bigint static,
             last_seq bigint static,
             acked_through bigint static, depth bigint static, dropped bigint static,
             delivered_through bigint static, appended_bytes bigint static,
             acked_bytes bigint static, compacted_through bigint static,
             message_id text, qos int, data blob, expires_at_ms bigint, released boolean,
             end_bytes bigint, size bigint, msg_seq bigint,
             PRIMARY KEY ((tenant, queue_id), seq, mid))
           WITH CLUSTERING ORDER BY (seq ASC, mid ASC) AND gc_grace_seconds = 10800""",
            AddColumn("partition_owner", "holder", "text"),
        ),
    ),
]

# ---- statements (prepared with ?; compaction formats %s) -----------------------------------
OWNER_GET = "SELECT epoch, holder FROM partition_owner WHERE partition=?"
OWNER_SET = "UPDATE partition_owner SET epoch=?, holder=? WHERE partition=? IF epoch=?"
OWNER_NEW = "INSERT INTO partition_owner (partition, epoch, holder) VALUES (?, 1, ?) IF NOT EXISTS"
REGISTER = "INSERT INTO partition_queues (partition, tenant, queue_id) VALUES (?,?,?) IF NOT EXISTS"
REGISTERED = "SELECT tenant, queue_id FROM partition_queues WHERE partition=?"
TAKE = "UPDATE queue_log SET fence=? WHERE tenant=? AND queue_id=? IF fence<?"
# DISTINCT reads the static row alone: never the clustering rows, where the message ids'
# expired cells and the acked entries' tombstones are (tombstone_warn_threshold).
STATE_GET = (
    f"SELECT DISTINCT tenant, queue_id, {STATICS} FROM queue_log WHERE tenant=? AND queue_id=?"
)
STATE_NEW = (
    f"INSERT INTO queue_log (tenant, queue_id, {STATICS}) "
    "VALUES (?,?,0,0,0,0,0,0,0,0,0,0) IF NOT EXISTS"
)  # owned by no epoch: only an append's compare-and-set, after its check, claims it
STATE_SET = (
    "UPDATE queue_log SET owner_epoch=?, version=?, last_seq=?, depth=?, dropped=?, "
    "appended_bytes=? WHERE tenant=? AND queue_id=? IF version=? AND fence<=? AND owner_epoch<=? "
    "AND last_seq=? AND depth=? AND dropped=? AND appended_bytes=? AND acked_through=?"
)  # every column the plan was made from: a replica read at ONE may mix two transactions'
ENTRY_PUT = (
    "INSERT INTO queue_log (tenant, queue_id, seq, mid, message_id, qos, data, "
    "expires_at_ms, released, end_bytes, size) VALUES (?,?,?,'',?,?,?,?,false,?,?) USING TTL ?"
)
MSGID_PUT = (
    "INSERT INTO queue_log (tenant, queue_id, seq, mid, msg_seq) VALUES (?,?,0,?,?) "
    "IF NOT EXISTS USING TTL ?"
)
MSGIDS_GET = "SELECT mid FROM queue_log WHERE tenant=? AND queue_id=? AND seq=0 AND mid IN ?"
ENTRY_DEL = "DELETE FROM queue_log WHERE tenant=? AND queue_id=? AND seq=? AND mid=''"
ENTRIES_READ = (
    "SELECT seq, qos, data, expires_at_ms, released FROM queue_log "
    "WHERE tenant=? AND queue_id=? AND seq>=? AND seq<=? LIMIT ?"
)
OFFSET = "SELECT end_bytes, size FROM queue_log WHERE tenant=? AND queue_id=? AND seq>? LIMIT 1"
ACK_SET = (
    "UPDATE queue_log SET acked_through=?, depth=?, version=?, acked_bytes=? "
    "WHERE tenant=? AND queue_id=? IF version=? AND last_seq=? AND acked_through=? AND depth=? "
    "AND acked_bytes=? AND appended_bytes=?"
)
RANGE_DEL = "DELETE FROM queue_log WHERE tenant=? AND queue_id=? AND seq>=? AND seq<=?"
RELEASE = (
    "UPDATE queue_log USING TTL ? SET released=true "
    "WHERE tenant=? AND queue_id=? AND seq=? AND mid='' IF EXISTS"
)
DELIVERED = (
    "UPDATE queue_log SET delivered_through=? WHERE tenant=? AND queue_id=? "
    "IF delivered_through=? AND last_seq>=?"
)
DROP_STATE = (
    f"DELETE {STATICS}, compacted_through FROM queue_log WHERE tenant=? AND queue_id=? IF version=?"
)
DEPTHS = "SELECT DISTINCT tenant, queue_id, depth, appended_bytes, acked_bytes FROM queue_log"


def applied(rows: list[Any]) -> bool:
    """Whether a lightweight transaction's result says it applied."""
    return bool(rows and rows[0][0])


def held(row: Any) -> int:
    """The bytes a queue's state holds."""
    return max(0, (row.appended_bytes or 0) - (row.acked_bytes or 0))


def live(row: Any) -> Any:
    """The state row if the queue has one (a partition left with message ids or tombstones
    only, or a static row deleted by a drop, reads as None)."""
    return row if row is not None and row.version is not None else None


def whole(row: Any) -> bool:
    """Whether a state row has every counter (a stale replica may miss some)."""
    return None not in (row.last_seq, row.acked_through, row.depth, row.dropped, row.version)


def state_of(row: Any) -> QueueState:
    """A state row as a `QueueState` (no row: an empty queue)."""
    if row is None:
        return QueueState(0, 0, 0, 0)
    return QueueState(
        row.last_seq, row.acked_through, row.depth, row.dropped, row.delivered_through, held(row)
    )
