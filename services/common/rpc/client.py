"""The one way a typed client (services/<service>/client.py) calls its service.

`LazyStub` holds the channel, the deadline and the admin token of one service address;
`call(stub.Method, request)` makes the call and turns a failed status into the exception tree
of services/common/rpc/errors.py. Clients build requests from domain values and return domain
values; nothing outside a client.py sees a stub.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import grpc

from services.common.rpc.credentials import mesh_metadata
from services.common.rpc.errors import error_from
from services.common.rpc.interceptors import ClientTraceInterceptor
from services.common.rpc.limits import grpc_options

S = TypeVar("S")
R = TypeVar("R")


# Several instances of a service: a call that finds its instance gone (connection refused,
# or the instance killed under it) is made again on another one, at most twice more. Every
# internal call may be repeated: the writes are idempotent (appends by message id,
# subscriptions by filter, deletes) or harmless to repeat.
_FAIL_OVER = json.dumps(
    {
        "loadBalancingConfig": [{"round_robin": {}}],
        "methodConfig": [
            {
                "name": [{}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "0.5s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ],
    }
)


def target(address: str) -> tuple[str, bool]:
    """The gRPC target of a service address, and whether it names several instances.

    `host:port` is one address (as today: one instance, or a load balancer); a
    comma-separated list of IPv4 `ip:port` (what `starling up` gives for several instances)
    becomes one channel over all of them; `dns:///name:port` is a name that resolves to every
    instance (a Kubernetes headless Service, a Compose service with replicas or a shared
    network alias: what deploy/ gives), balanced and failed over the same way."""
    if address.startswith("dns:///"):
        return address, True
    parts = [a.strip() for a in address.split(",") if a.strip()]
    if len(parts) <= 1:
        return address, False
    return "ipv4:" + ",".join(parts), True


def channel(address: str) -> grpc.aio.Channel:
    """Client channel with tracing and the mesh's message size limits
    (services/common/rpc/limits.py); `LazyStub` wraps it in a service stub. Calls are spread
    round robin over the instances behind `address` and fail over (`target`)."""
    name, several = target(address)
    fail_over = [("grpc.service_config", _FAIL_OVER)] if several else []
    return grpc.aio.insecure_channel(
        name,
        interceptors=[ClientTraceInterceptor()],
        options=[
            ("grpc.enable_retries", 1),
            ("grpc.keepalive_time_ms", 20000),
            *fail_over,
            *grpc_options(),
        ],
    )


class LazyStub(Generic[S]):
    """A service stub whose channel is created on first use, inside the running event loop.

    grpc.aio channels belong to the loop that was current when they were made; clients are
    often built in a service's constructor, before `uvloop.run` starts the real loop.
    With `token`, every call carries `authorization: Bearer <token>` (the *AdminService
    APIs require it); every call carries the process's mesh secret, if it has one
    (services/common/rpc/credentials.py).
    """

    def __init__(
        self,
        address: str,
        stub_cls: Callable[[grpc.aio.Channel], S],
        *,
        timeout_s: float,
        token: str = "",
    ) -> None:
        self._address = address
        self._stub_cls = stub_cls
        self._timeout_s = timeout_s
        self._token = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel: grpc.aio.Channel | None = None
        self._stub: S | None = None

    @property
    def stub(self) -> S:
        if self._stub is None:
            self._channel = channel(self._address)
            self._stub = self._stub_cls(self._channel)
        return self._stub

    async def call(self, method: Callable[..., Awaitable[R]], request: Any) -> R:
        """`await method(request)` with the deadline and token; a failed status raises the
        matching `ServiceError` subclass (`UnavailableError` when the service is down)."""
        try:
            metadata = self._token + mesh_metadata()
            return await method(request, timeout=self._timeout_s, metadata=metadata or None)
        except grpc.aio.AioRpcError as exc:
            raise error_from(exc) from exc

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None
