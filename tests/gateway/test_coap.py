"""The CoAP gateway against the shared mesh, with the aiocoap client: publishes reach MQTT
subscribers, an observation receives MQTT publishes, CoAP clients are clients of their
tenant, and refusals have their response codes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiocoap
import pytest

from services.session.client import SessionAdminClient
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.e2e.clients import Paho
from tests.gateway.helpers import add_user, subscriber, unique
from tests.poll import eventually


@pytest.fixture
async def coap() -> AsyncIterator[aiocoap.Context]:
    ctx = await aiocoap.Context.create_client_context()
    yield ctx
    await ctx.shutdown()


def _uri(mesh: MeshInfo, path: str, **query: str) -> str:
    q = "&".join(f"{k}={v}" for k, v in query.items())
    return f"{mesh.gateway_coap}{path}" + (f"?{q}" if q else "")


async def _request(ctx: aiocoap.Context, method: aiocoap.Code, uri: str, payload: bytes = b""):  # type: ignore[no-untyped-def]
    return await asyncio.wait_for(
        ctx.request(aiocoap.Message(code=method, uri=uri, payload=payload)).response, 15
    )


async def test_coap_posts_reach_mqtt_subscriber(mesh: MeshInfo, coap: aiocoap.Context) -> None:
    """20 CoAP POSTs to /ps/gw/coap (QoS 1) arrive at an MQTT subscriber of tenant acme."""
    await add_user(mesh, "acme", "coap-dev", "pw-coap")
    await add_user(mesh, "acme", "coap-sub", "pw-sub")
    sub = subscriber(mesh, 1, "acme/coap-sub", "pw-sub", "gw/coap")
    try:
        creds = {"clientid": unique("coap-"), "username": "acme/coap-dev", "password": "pw-coap"}
        uri = _uri(mesh, "/ps/gw/coap", qos="1", **creds)
        for i in range(20):
            resp = await _request(coap, aiocoap.POST, uri, f"coap-{i}".encode())
            assert resp.code == aiocoap.Code.CHANGED, resp.payload
        got = await asyncio.to_thread(sub.expect, 20)
        assert sorted(m.payload.decode() for m in got) == sorted(f"coap-{i}" for i in range(20))
        await asyncio.to_thread(sub.nothing, 0.3)
    finally:
        sub.close()


async def test_observe_receives_mqtt_publishes(mesh: MeshInfo, coap: aiocoap.Context) -> None:
    """A CoAP Observe on /ps/gw/obs receives 5 MQTT publishes (QoS 1: confirmable), and
    the CoAP client is listed among the tenant's clients while it observes."""
    await add_user(mesh, "acme", "coap-obs", "pw-obs")
    await add_user(mesh, "acme", "mqtt-pub", "pw-pub")
    client_id = unique("obs-")
    uri = _uri(mesh, "/ps/gw/obs", clientid=client_id, username="acme/coap-obs", password="pw-obs")
    request = coap.request(aiocoap.Message(code=aiocoap.GET, uri=uri, observe=0))
    first = await asyncio.wait_for(request.response, 15)
    assert first.code == aiocoap.Code.CONTENT, first.payload
    pub = Paho(mesh.node(0), username="acme/mqtt-pub", password="pw-pub")
    pub.connect()
    notes: list[aiocoap.Message] = []

    async def read() -> None:
        async for note in request.observation:
            notes.append(note)
            if len(notes) == 5:
                return

    reading = asyncio.create_task(read())
    try:
        for i in range(5):
            await asyncio.to_thread(pub.publish, "gw/obs", f"obs-{i}", 1)
        await asyncio.wait_for(reading, 15)
        assert [n.payload.decode() for n in notes] == [f"obs-{i}" for i in range(5)]
        assert all(n.mtype == aiocoap.CON for n in notes)
        admin = SessionAdminClient(mesh.addr("session"), ADMIN_TOKEN)
        try:
            clients = await admin.list_clients("acme")
        finally:
            await admin.close()
        (mine,) = [c for c in clients if c.client_id == client_id]
        assert mine.node_id == "gateway"
    finally:
        reading.cancel()
        request.observation.cancel()
        pub.close()


async def test_observe_wildcard_qos0_non_confirmable(mesh: MeshInfo, coap: aiocoap.Context) -> None:
    await add_user(mesh, "acme", "coap-w", "pw-w")
    uri = _uri(
        mesh,
        "/ps/gw/wild/%2B",  # `+` (percent-encoded, as in any URI)
        clientid=unique("w-"),
        username="acme/coap-w",
        password="pw-w",
        qos="0",
    )
    request = coap.request(aiocoap.Message(code=aiocoap.GET, uri=uri, observe=0))
    first = await asyncio.wait_for(request.response, 15)
    assert first.code == aiocoap.Code.CONTENT, first.payload
    pub = Paho(mesh.node(1), username="acme/coap-w", password="pw-w")
    pub.connect()
    try:
        await asyncio.to_thread(pub.publish, "gw/wild/a", "w", 1)
        note = await asyncio.wait_for(request.observation.__aiter__().__anext__(), 15)
        assert note.payload == b"w"
        assert note.mtype == aiocoap.NON
    finally:
        request.observation.cancel()
        pub.close()


async def test_refusals(mesh: MeshInfo, coap: aiocoap.Context) -> None:
    await add_user(mesh, "acme", "coap-r", "pw-r")
    good = {"clientid": unique("r-"), "username": "acme/coap-r", "password": "pw-r"}
    bad = {**good, "password": "wrong"}
    resp = await _request(coap, aiocoap.POST, _uri(mesh, "/ps/gw/r", **bad), b"x")
    assert resp.code == aiocoap.Code.UNAUTHORIZED
    resp = await _request(coap, aiocoap.POST, _uri(mesh, "/ps/gw/r"), b"x")
    assert resp.code == aiocoap.Code.BAD_REQUEST  # no clientid
    resp = await _request(coap, aiocoap.POST, _uri(mesh, "/ps/gw/%23", **good), b"x")
    assert resp.code == aiocoap.Code.BAD_REQUEST  # a wildcard topic
    resp = await _request(coap, aiocoap.POST, _uri(mesh, "/ps/gw/r", qos="7", **good), b"x")
    assert resp.code == aiocoap.Code.BAD_REQUEST
    resp = await _request(coap, aiocoap.DELETE, _uri(mesh, "/ps/gw/r", **good))
    assert resp.code == aiocoap.Code.METHOD_NOT_ALLOWED
    resp = await _request(coap, aiocoap.POST, _uri(mesh, "/other", **good), b"x")
    assert resp.code == aiocoap.Code.NOT_FOUND


async def test_connection_mode_token(mesh: MeshInfo, coap: aiocoap.Context) -> None:
    """POST /mqtt/connection answers a token; publishes carry it instead of the password;
    DELETE ends the client (it leaves the tenant's clients). Its connect and disconnect are
    `$SYS/brokers/gateway/clients/...` notices in its tenant, as a node's clients' are."""
    await add_user(mesh, "acme", "coap-t", "pw-t")
    client_id = unique("t-")
    notices = subscriber(mesh, 1, "acme/coap-t", "pw-t", f"$SYS/brokers/+/clients/{client_id}/+")
    login = {"clientid": client_id, "username": "acme/coap-t", "password": "pw-t"}
    resp = await _request(coap, aiocoap.POST, _uri(mesh, "/mqtt/connection", **login))
    assert resp.code == aiocoap.Code.CREATED, resp.payload
    token = resp.payload.decode()
    with_token = {"clientid": client_id, "token": token}
    resp = await _request(coap, aiocoap.PUT, _uri(mesh, "/ps/gw/t", **with_token), b"x")
    assert resp.code == aiocoap.Code.CHANGED, resp.payload
    resp = await _request(coap, aiocoap.PUT, _uri(mesh, "/ps/gw/t", clientid=client_id, token="x"))
    assert resp.code == aiocoap.Code.UNAUTHORIZED
    admin = SessionAdminClient(mesh.addr("session"), ADMIN_TOKEN)
    try:

        async def listed() -> bool:
            return any(c.client_id == client_id for c in await admin.list_clients("acme"))

        assert await listed()
        resp = await _request(coap, aiocoap.DELETE, _uri(mesh, "/mqtt/connection", **with_token))
        assert resp.code == aiocoap.Code.DELETED
        await eventually(lambda: _not(listed), what="the client to leave the registry")
        said = await asyncio.to_thread(notices.expect, 2)
        assert [m.topic for m in said] == [
            f"$SYS/brokers/gateway/clients/{client_id}/connected",
            f"$SYS/brokers/gateway/clients/{client_id}/disconnected",
        ]
        assert json.loads(said[0].payload)["username"] == "coap-t"
        assert json.loads(said[1].payload)["reason"] == "normal"
    finally:
        notices.close()
        await admin.close()


async def _not(check) -> bool:  # type: ignore[no-untyped-def]
    return not await check()


async def test_observe_starts_with_retained(mesh: MeshInfo, coap: aiocoap.Context) -> None:
    """A retained message (published over HTTP here) is the observation's first
    notification, as an MQTT SUBSCRIBE gets it."""
    import aiohttp

    from tests.gateway.helpers import bearer, post

    tag = unique("ret")
    await add_user(mesh, "acme", "coap-ret", "pw-ret")
    async with aiohttp.ClientSession(mesh.gateway_http) as http:
        body = {"topic": f"gw/{tag}", "payload": "kept", "qos": 1, "retain": True, "tenant": "acme"}
        status, answer, _ = await post(http, "/api/v5/publish", body, bearer(ADMIN_TOKEN))
    assert status == 200, answer
    uri = _uri(
        mesh, f"/ps/gw/{tag}", clientid=unique("r-"), username="acme/coap-ret", password="pw-ret"
    )
    request = coap.request(aiocoap.Message(code=aiocoap.GET, uri=uri, observe=0))
    try:
        first = await asyncio.wait_for(request.response, 15)
        assert first.code == aiocoap.Code.CONTENT
        note = await asyncio.wait_for(request.observation.__aiter__().__anext__(), 15)
        assert note.payload == b"kept" and note.mtype == aiocoap.CON
    finally:
        request.observation.cancel()


async def test_an_mqtt_connect_takes_the_client_id_over(
    mesh: MeshInfo, coap: aiocoap.Context
) -> None:
    """A CoAP client is a client of its tenant: an MQTT CONNECT with its client id takes it
    over, its observation ends (5.03), and the MQTT client is the one listed."""
    await add_user(mesh, "acme", "coap-k", "pw-k")
    client_id = unique("k-")
    uri = _uri(mesh, "/ps/gw/k", clientid=client_id, username="acme/coap-k", password="pw-k")
    request = coap.request(aiocoap.Message(code=aiocoap.GET, uri=uri, observe=0))
    first = await asyncio.wait_for(request.response, 15)
    assert first.code == aiocoap.Code.CONTENT

    async def ended() -> str:
        try:
            async for note in request.observation:
                if not note.code.is_successful():
                    return str(note.code)
        except Exception as exc:  # aiocoap ends the iteration with the final error
            return repr(exc)
        return "ended"

    ending = asyncio.create_task(ended())
    mqtt = Paho(mesh.node(0), client_id=client_id, username="acme/coap-k", password="pw-k")
    mqtt.connect()
    try:
        said = await asyncio.wait_for(ending, 15)
        assert "5.03" in said or "Service Unavailable" in said, said
        admin = SessionAdminClient(mesh.addr("session"), ADMIN_TOKEN)
        try:
            (mine,) = [c for c in await admin.list_clients("acme") if c.client_id == client_id]
        finally:
            await admin.close()
        assert mine.node_id == "connection-0"
    finally:
        mqtt.close()
        if not request.observation.cancelled:
            request.observation.cancel()


async def test_clients_reasserted_when_the_registry_was_lost(
    mesh: MeshInfo, coap: aiocoap.Context
) -> None:
    """`ctl.nodes.reassert` (the session service lost its registry): the gateway installs
    its CoAP clients again, as a node does, and they stay listed."""
    import nats

    await add_user(mesh, "acme", "coap-ra", "pw-ra")
    client_id = unique("ra-")
    login = {"clientid": client_id, "username": "acme/coap-ra", "password": "pw-ra"}
    resp = await _request(coap, aiocoap.POST, _uri(mesh, "/mqtt/connection", **login))
    assert resp.code == aiocoap.Code.CREATED
    nc = await nats.connect(mesh.nats_url)
    try:
        await nc.publish("ctl.nodes.reassert", b"test")
        await nc.flush()
    finally:
        await nc.close()
    log = mesh.mesh.by_name("gateway").log

    def reasserted() -> bool:
        with open(log) as f:
            return any('"registry_reasserted"' in line for line in f)

    await eventually(reasserted, 10, "the gateway's registry_reasserted log line")
    admin = SessionAdminClient(mesh.addr("session"), ADMIN_TOKEN)
    try:
        clients = await admin.list_clients("acme")
    finally:
        await admin.close()
    assert any(c.client_id == client_id and c.node_id == "gateway" for c in clients)
