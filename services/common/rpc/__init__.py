"""gRPC helpers: server build/stop, health, reflection, interceptors (server.py); the call
helper every typed client uses (client.py); one exception tree for both sides (errors.py)."""
