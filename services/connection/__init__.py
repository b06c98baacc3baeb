"""Connection service: owns the MQTT listeners (TCP, TLS, WebSocket, WSS), per-connection
protocol state (the sans-I/O `channel` package: keep alive, packet ids, inflight windows,
topic aliases, receive maximum, will), local fan-out to its clients and the NATS
subscriptions for their filters. `node.py` wires one module per behaviour; the map is in
docs/architecture.md. Authentication, ACLs and the session registry belong to the session
service, reached through services.session.client.
"""
