"""Queue service: owns durable per-session queues (append, read, ack/trim, depth limits,
released marks for outbound QoS 2) on Cassandra or the embedded SQLite store.

Queues are split into `queue_partitions` partitions. Instances lease them in Redis, a fair
share each (services/queue/leases.py), and claim each leased partition in the store, which
raises its fencing epoch so an older owner can no longer append (services/queue/ownership.py);
they announce what they own on ctl.queue.owners, and callers send each queue's calls to its
owner (services/queue/owner_calls.py). After entries commit, a `QueueNotice` on
`qn.<tenant>.<queue_id>` tells the node that holds the session to read them. Each instance
reports the entries waiting per tenant in the partitions it owns, and checks appends against
a tenant's max_queued_bytes with the bytes every instance holds for it (services/queue/
depths.py; instances announce theirs on ctl.queue.bytes).
"""
