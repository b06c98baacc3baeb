"""Queue service: owns durable per-session queues (append, read, ack/trim, depth limits,
released marks for outbound QoS 2) on Cassandra or the embedded SQLite store.

Queues are split into `queue_partitions` partitions; this instance owns those with
`partition % instance_count == instance_ordinal` (static assignment, like a StatefulSet) and
claims each at start, which raises the partition's fencing epoch so an older owner can no
longer append. After entries commit, a `QueueNotice` on `qn.<tenant>.<queue_id>` tells the
node that holds the session to read them.
"""
