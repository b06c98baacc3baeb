"""NATS: connection, protobuf publish/request, subject names (see subjects.py)."""
