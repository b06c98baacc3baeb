"""Translation of the offline-session admin calls (ListSessions, DiscardSession) between
their protobuf messages and services/session/offline.py; SessionAdminApi delegates here."""

from __future__ import annotations

from services.common.rpc.errors import InvalidArgumentError
from services.session.offline import OfflineSessions, SessionPage
from starling.session.v1 import session_pb2 as pb


async def list_sessions(
    offline: OfflineSessions, tenant: str, request: pb.ListSessionsRequest
) -> pb.ListSessionsResponse:
    page = await offline.page(
        tenant, prefix=request.client_id_prefix, after=request.after, limit=request.limit
    )
    return page_to_pb(page)


async def discard_session(
    offline: OfflineSessions, tenant: str, request: pb.DiscardSessionRequest
) -> pb.DiscardSessionResponse:
    if not request.client_id:
        raise InvalidArgumentError("client_id is required")
    return pb.DiscardSessionResponse(discarded=await offline.discard(tenant, request.client_id))


def page_to_pb(page: SessionPage) -> pb.ListSessionsResponse:
    return pb.ListSessionsResponse(
        sessions=[
            pb.OfflineSession(
                client_id=s.client_id,
                owner=s.owner,
                incarnation=s.incarnation,
                disconnected_at_ms=s.disconnected_at_ms,
                expires_at_ms=s.expires_at_ms,
                queue_depth=s.queue_depth or 0,
                queue_depth_known=s.queue_depth is not None,
            )
            for s in page.sessions
        ],
        next=page.next,
    )
