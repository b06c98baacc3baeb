"""Connection service: owns the MQTT listeners (TCP, TLS, WebSocket, WSS), per-connection
protocol state (channel.py: keep alive, packet ids, inflight windows, topic aliases, receive
maximum, will), local fan-out to its clients and the NATS subscriptions for their filters
(node.py). Authentication, ACLs and the session registry belong to the session service,
reached through services.session.client.
"""
