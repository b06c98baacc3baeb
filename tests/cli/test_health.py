"""`starling health ADDR` and `python -m services.cli.health ADDR` (what the compose file's
health checks run in each container)."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.cli.health import main as health_main
from services.cli.main import main
from services.cli.ports import free_port


def test_health_exits_0_only_while_serving(capsys: pytest.CaptureFixture[str]) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    address = f"127.0.0.1:{port}"
    try:
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        servicer.set("liveness", health_pb2.HealthCheckResponse.SERVING)
        assert main(["health", address]) == 0
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)  # a draining node
        assert main(["health", address]) == 1
        assert health_main([address, "--service", "liveness"]) == 0  # what compose runs
    finally:
        server.stop(None).wait()
    assert main(["health", address, "--timeout-s", "0.5"]) == 1  # nobody there
    assert capsys.readouterr().out.split() == ["SERVING", "NOT_SERVING", "SERVING", "UNREACHABLE"]
