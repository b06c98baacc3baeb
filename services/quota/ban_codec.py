"""A ban <-> its protobuf, the one conversion: the quota service's servicer (api.py) and its
clients (client.py: operators, and the holders of a ban list copy through it,
services/common/ban_watch.py) both use it."""

from __future__ import annotations

from services.common.bans import Ban, BanKind
from starling.quota.v1 import quota_pb2 as pb


def ban_to_pb(b: Ban) -> pb.Ban:
    return pb.Ban(
        kind=int(b.kind),  # type: ignore[arg-type]
        tenant=b.tenant,
        value=b.value,
        reason=b.reason,
        expires_at_ms=b.expires_at_ms,
        created_at_ms=b.created_at_ms,
        source=b.source,
    )


def ban_from_pb(b: pb.Ban) -> Ban:
    return Ban(
        kind=BanKind(b.kind),
        tenant=b.tenant,
        value=b.value,
        reason=b.reason,
        expires_at_ms=b.expires_at_ms,
        created_at_ms=b.created_at_ms,
        source=b.source or "operator",
    )
