"""What a failed gRPC health check reports (`starling health`, `starling status`); imports
only gRPC, so container health checks stay cheap."""

from __future__ import annotations

import grpc


def failed_check(code: grpc.StatusCode) -> str:
    """What a health check that got `code` reports: only a server that did not answer is
    UNREACHABLE (one that answered NOT_FOUND has no such service)."""
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return "UNREACHABLE"
    return "SERVICE_UNKNOWN" if code is grpc.StatusCode.NOT_FOUND else str(code.name)
