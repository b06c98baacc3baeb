"""RED metrics of every RPC a process serves, gRPC (services/common/rpc/interceptors.py)
and NATS request/reply (services/common/bus/unary.py) alike: requests, errors and the
duration histogram per service, method and outcome, on the process's Prometheus endpoint.

- `starling_rpc_requests_total{service, method, outcome, transport}`
- `starling_rpc_errors_total{service, method, outcome, transport}` (outcome not OK)
- `starling_rpc_duration_seconds{service, method, outcome, transport}` (histogram)

`outcome` is the gRPC status code name (`OK`, `INVALID_ARGUMENT`, ...; a NATS reply's error
carries the same names). Instruments are looked up once per process (first use), so a call
costs two adds and one histogram record.
"""

from __future__ import annotations

from functools import cache

from opentelemetry import metrics

DURATION_BOUNDS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


@cache
def _instruments() -> tuple[metrics.Counter, metrics.Counter, metrics.Histogram]:
    meter = metrics.get_meter("starling.rpc")
    return (
        meter.create_counter("starling_rpc_requests", description="RPCs served"),
        meter.create_counter("starling_rpc_errors", description="RPCs answered with an error"),
        meter.create_histogram(
            "starling_rpc_duration_seconds",
            unit="s",
            description="Time to answer an RPC",
            explicit_bucket_boundaries_advisory=DURATION_BOUNDS_S,
        ),
    )


def split_method(method: str) -> tuple[str, str]:
    """`/starling.router.v1.RouterService/Route` -> (`starling.router.v1.RouterService`,
    `Route`); a NATS subject is the service's NATS endpoint: (subject's first two parts,
    the rest)."""
    if method.startswith("/"):
        service, _, name = method[1:].rpartition("/")
        return service, name
    head, _, rest = method.partition(".")
    mid, _, tail = rest.partition(".")
    return f"{head}.{mid}" if mid else head, tail or method


def record(method: str, outcome: str, seconds: float, transport: str) -> None:
    """One RPC served: `method` as gRPC names it or the NATS subject."""
    requests, errors, duration = _instruments()
    service, name = split_method(method)
    labels = {"service": service, "method": name, "outcome": outcome, "transport": transport}
    requests.add(1, labels)
    if outcome != "OK":
        errors.add(1, labels)
    duration.record(seconds, labels)
