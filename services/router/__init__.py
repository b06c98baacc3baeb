"""Router service: owns persistent routing (QoS>=1 publishes to persistent sessions' queues),
retained messages, delayed publish, shared-subscription policy and the authoritative route
table with its admin API. This release serves health and reflection and holds its NATS
connection; routing arrives with the persistence and retained issues."""
