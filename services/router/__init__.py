"""Router service: owns persistent routing. It keeps the authoritative table of persistent
sessions' subscriptions (in the store, and in memory as one trie per tenant, loaded before the
service reports SERVING) and, for every QoS>=1 publish a node hands it, appends the message to
the queue of every matching persistent session before answering STORED; the node acknowledges
the publisher only then. QoS 0 is not queued for offline sessions. Retained messages, delayed
publish and the shared-subscription policy arrive with the retained/shared issue.
"""
