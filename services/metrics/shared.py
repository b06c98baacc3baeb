"""What several metrics instances share through Redis: each reporter's latest report.

Nodes and services send their cumulative reports to whichever instance their channel picks,
so no instance sees all of a reporter's reports. Each report is swapped into the reporter's
Redis hash (`starling:metrics:report:<reporter>`: the reporter's `ts_ms`, the receiving
instance's clock `at`, the report) by one script, which hands back the report it replaced:
the usage delta is always taken against the reporter's previous report, whichever instance
got it, so N instances count what one would. A report not newer (`ts_ms`) than the stored one
is a repeat (a call retried on another instance) or late: it adds nothing. The swap comes
before the usage write, so an instance dying between the two loses that report's delta (at
most once, never twice).

Every instance reloads all reporters' latest reports from Redis every `REFRESH_S` into its
`ClusterStats`, so `GetClusterStats`, the cluster Prometheus endpoint and `$SYS` show every
reporter on any instance. Keys expire after `KEEP_MS` of silence (a reporter back after
that is counted from zero, like a restart).
"""

from __future__ import annotations

import time
from typing import Any

from services.common import clock
from services.metrics.client import from_pb
from services.metrics.core import ClusterStats
from starling.metrics.v1 import metrics_pb2 as pb

PREFIX = "starling:metrics:report:"
KEEP_MS = 7 * 24 * 3_600_000
REFRESH_S = 1.0

# KEYS[1] the reporter's hash; ARGV: ts_ms, at (ms), report, kind, ttl ms.
# {1, previous at, previous report} when stored; {0} when not newer than the stored one.
_SWAP = """
local cur = redis.call('HGET', KEYS[1], 'ts')
if cur and tonumber(cur) >= tonumber(ARGV[1]) then return {0} end
local old = redis.call('HMGET', KEYS[1], 'at', 'body')
redis.call('HSET', KEYS[1], 'ts', ARGV[1], 'at', ARGV[2], 'body', ARGV[3], 'kind', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {1, old[1] or '', old[2] or ''}
"""


class SharedReports:
    def __init__(self, redis: Any) -> None:
        self._redis = redis

    async def swap(
        self, reporter: str, ts_ms: int, at_ms: int, report: bytes, kind: str
    ) -> tuple[bool, int | None, bytes]:
        """Store the report unless a newer one is; (stored, the previous one's `at` or None
        when there was none, the previous report or b"")."""
        res = await self._redis.eval(
            _SWAP, 1, PREFIX + reporter, ts_ms, at_ms, report, kind, KEEP_MS
        )
        if int(res[0]) == 0:
            return False, None, b""
        prev_at = int(res[1]) if res[1] else None
        return True, prev_at, bytes(res[2] or b"")

    async def latest(self) -> list[tuple[str, int, str, bytes]]:
        """Every reporter's latest report: (reporter, at ms, kind, report)."""
        out: list[tuple[str, int, str, bytes]] = []
        async for key in self._redis.scan_iter(match=PREFIX + "*", count=500):
            at, kind, body = await self._redis.hmget(key, "at", "kind", "body")
            if at is None or body is None:
                continue  # expired between the scan and the read
            name = key.decode() if isinstance(key, bytes) else key
            kind_s = kind.decode() if isinstance(kind, bytes) else (kind or "")
            out.append((name[len(PREFIX) :], int(at), kind_s, bytes(body)))
        return out


def monotonic_of(at_ms: int, now_ms: int | None = None) -> float:
    """A wall-clock receipt time as this process's monotonic clock (ClusterStats ages
    reports by it)."""
    now = clock.now_ms() if now_ms is None else now_ms
    return time.monotonic() - max(0, now - at_ms) / 1000


async def load_latest(shared: SharedReports, stats: ClusterStats) -> None:
    """Put every reporter's latest report, whichever instance got it, into `stats`."""
    for reporter, at_ms, kind, body in await shared.latest():
        report = pb.ReportNodeStatsRequest.FromString(body)
        tenants = {t.tenant: from_pb(t).counts() for t in report.tenants}
        stats.report(reporter, monotonic_of(at_ms), tenants, kind, report.resident_memory_bytes)
