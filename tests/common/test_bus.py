"""The NATS helper against a real nats-server: protobuf request/reply with trace headers."""

from __future__ import annotations

from nats.aio.msg import Msg

from services.common.bus import subjects
from services.common.bus.client import connect, parse, request_proto
from services.common.bus.flushing import flushed
from starling.session.v1 import session_pb2


async def test_protobuf_request_round_trip(nats_url: str) -> None:
    server = await connect(nats_url, "test-responder")
    client = await connect(nats_url, "test-requester")

    async def respond(msg: Msg) -> None:
        req = parse(msg, session_pb2.KickClientRequest)
        await msg.respond(
            session_pb2.KickClientResponse(
                kicked=req.client_id == "c1" and req.tenant == "t"
            ).SerializeToString()
        )

    await server.subscribe("svc.test.kick", cb=respond)
    await flushed(server)
    reply = await request_proto(
        client,
        "svc.test.kick",
        session_pb2.KickClientRequest(tenant="t", client_id="c1"),
        session_pb2.KickClientResponse,
        timeout_s=5,
    )
    assert reply.kicked is True
    await client.close()
    await server.close()


def test_subject_names_escape_their_tokens() -> None:
    assert subjects.node_control("node.1") == "ctl.node.node~2E1"
    assert subjects.event("acme", "connected") == "ev.acme.connected"
