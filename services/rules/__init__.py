"""Rules service: owns SQL-like rules over messages and client events and their actions
(republish, HTTP, bridges, store insert) with hot reload. This release serves health and
reflection and holds its NATS connection."""
