"""gRPC helpers: server build/stop, health, reflection, interceptors, status mapping."""
