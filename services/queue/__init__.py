"""Queue service: owns durable per-session queues (append, read, ack/trim, depth limits, expiry)
on Cassandra or the embedded store, and pushes new entries to the node holding the session.
This release serves health and reflection; the store arrives with the persistence issue."""
