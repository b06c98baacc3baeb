"""Kicking a connection off its node: the Kick sent on the node's control subject, fire and
forget (`send_kick`) or asking whether the connection had already ended (`kick_and_ask`).

Used by the CONNECT flow (services/session/connecting.py) for the connection a new one
displaces, by a node's re-assertion, and by the admin API's KickClient."""

from __future__ import annotations

import logging

from nats.aio.client import Client
from nats.errors import NoRespondersError

from services.common.bus import subjects
from services.common.bus.client import request_proto
from services.common.bus.flushing import flushed
from services.session.registry import Holder
from starling.connection.v1 import connection_pb2

log = logging.getLogger(__name__)

KICK_REPLY_TIMEOUT_S = 1.0


def _kick(holder: Holder, reason: int) -> connection_pb2.Kick:
    return connection_pb2.Kick(
        tenant=holder.tenant, client_id=holder.client_id, epoch=holder.epoch, reason_code=reason
    )


async def send_kick(nc: Client, holder: Holder, reason: int) -> None:
    await nc.publish(
        subjects.node_control(holder.node_id), _kick(holder, reason).SerializeToString()
    )
    await flushed(nc, 2)


async def kick_and_ask(
    nc: Client, holder: Holder, reason: int
) -> tuple[connection_pb2.KickReply | None, bool]:
    """Kick the displaced connection and learn whether it had already ended (and with which
    Session Expiry); no reply when its node does not answer in time. Also whether its node
    is known to be gone: nobody listens on its subject (its process died), or it answers as
    a process that never had the connection (it restarted under the same id)."""
    try:
        reply = await request_proto(
            nc,
            subjects.node_control(holder.node_id),
            _kick(holder, reason),
            connection_pb2.KickReply,
            timeout_s=KICK_REPLY_TIMEOUT_S,
        )
    except NoRespondersError:
        log.warning("kick_unanswered", extra={"node": holder.node_id, "error": "no responders"})
        return None, True
    except Exception as exc:  # a timeout: the node is dying, or busy
        log.warning("kick_unanswered", extra={"node": holder.node_id, "error": type(exc).__name__})
        return None, False
    return reply, reply.unknown
