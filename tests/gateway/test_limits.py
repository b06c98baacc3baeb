"""The per-address request rates, on a second gateway of the shared mesh started with the
production caps lowered (the mesh's own gateway runs the development profile: no cap):
HTTP answers 429 with Retry-After, CoAP 4.29 with Max-Age, and the next second admits
again."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import aiocoap
import aiohttp
import pytest

from services.cli.ports import free_port
from tests.conftest import ADMIN_TOKEN, MeshInfo, wait_port
from tests.gateway.helpers import add_user, bearer, post, unique
from tests.poll import eventually

PER_S = 5


@dataclass
class Capped:
    http: str
    coap: str


@pytest.fixture(scope="module")
def capped(mesh: MeshInfo) -> Iterator[Capped]:
    _, env = mesh.launcher._specs["gateway"]
    assert env is not None
    http, coap = free_port(), free_port()
    env = {
        **env,
        "STARLING_NODE_ID": "gateway-capped",
        "STARLING_GRPC_PORT": str(free_port()),
        "STARLING_METRICS_PORT": "-1",
        "STARLING_GATEWAY_HTTP_PORT": str(http),
        "STARLING_GATEWAY_HTTPS_PORT": "-1",
        "STARLING_GATEWAY_COAP_PORT": str(coap),
        "STARLING_GATEWAY_REQUESTS_PER_IP_PER_S": str(PER_S),
        "STARLING_GATEWAY_COAP_MESSAGES_PER_IP_PER_S": str(PER_S),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.gateway"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(http, proc, "the capped gateway", within_s=30)
        yield Capped(f"http://127.0.0.1:{http}", f"coap://127.0.0.1:{coap}")
    finally:
        proc.terminate()
        proc.wait(15)


async def test_http_requests_per_address(capped: Capped) -> None:
    async with aiohttp.ClientSession(capped.http) as http:
        body = {"topic": "rate/t", "payload": "p", "tenant": "open"}

        async def refused() -> aiohttp.ClientResponse | None:
            answers = await asyncio.gather(
                *(
                    post(http, "/api/v5/publish", body, bearer(ADMIN_TOKEN))
                    for _ in range(PER_S + 1)
                )
            )
            return next((r for status, _, r in answers if status == 429), None)

        resp = await eventually(refused, 10, "a 429 (the cap's second may turn mid-burst)")
        assert resp.headers["Retry-After"] == "1"

        async def admitted() -> bool:
            return (await post(http, "/api/v5/publish", body, bearer(ADMIN_TOKEN)))[0] == 200

        await eventually(admitted, 5, "a request in the next second")


async def test_coap_requests_per_address(mesh: MeshInfo, capped: Capped) -> None:
    await add_user(mesh, "acme", "coap-rate", "pw")
    uri = f"{capped.coap}/ps/rate/t?clientid={unique('rate-')}&username=acme/coap-rate&password=pw"
    ctx = await aiocoap.Context.create_client_context()
    try:

        async def refused() -> aiocoap.Message | None:
            answers = await asyncio.gather(
                *(
                    ctx.request(aiocoap.Message(code=aiocoap.POST, uri=uri, payload=b"x")).response
                    for _ in range(PER_S + 1)
                )
            )
            return next((a for a in answers if a.code == aiocoap.Code.TOO_MANY_REQUESTS), None)

        answer = await eventually(refused, 10, "a 4.29")
        assert answer.opt.max_age == 1
    finally:
        await ctx.shutdown()
