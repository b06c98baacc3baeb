"""`starling health ADDR` (also `python -m services.cli.health ADDR`): the gRPC health of one
service process, exit status 0 only while SERVING. Container health checks run it every few
seconds, so this module imports gRPC and nothing else of Starling, and gRPC only when it
checks (`starling` registers the arguments of every command, `add_arguments` among them)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("address", help="host:port of its gRPC server, e.g. 127.0.0.1:7001")
    p.add_argument(
        "--service", default="", help="health service name (default: the process as a whole)"
    )
    p.add_argument("--timeout-s", type=float, default=2.0)


async def status_of(address: str, service: str, timeout_s: float) -> str:
    """SERVING, NOT_SERVING, ...; UNREACHABLE (no answer); SERVICE_UNKNOWN (the server has
    no such health service); or the gRPC status the server answered with."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from services.common.rpc.health_status import failed_check

    async with grpc.aio.insecure_channel(address) as ch:
        try:
            resp = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            return failed_check(exc.code())
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))


def run(args: argparse.Namespace) -> int:
    import asyncio

    status = asyncio.run(status_of(args.address, args.service, args.timeout_s))
    print(status)
    return 0 if status == "SERVING" else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="starling health", description=__doc__)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
