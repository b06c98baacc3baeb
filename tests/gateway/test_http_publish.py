"""The HTTP publish API against the shared mesh, with real clients (aiohttp, curl): what is
answered 200 arrives once at MQTT subscribers; every refusal has its status and reason."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import ssl
import subprocess

import aiohttp
import pytest

from services.common.tenant_limits import Limits
from services.quota.client import QuotaAdminClient
from tests.conftest import ADMIN_TOKEN, MeshInfo
from tests.gateway.helpers import add_user, basic, bearer, post, subscriber, tenant_token, unique
from tests.poll import eventually

PUBLISH = "/api/v5/publish"
BULK = "/api/v5/publish/bulk"


async def test_single_and_bulk_qos1_arrive_exactly_once(mesh: MeshInfo) -> None:
    """20 single and 20 bulk QoS 1 publishes (tenant token), each exactly once at a
    subscriber of tenant acme on another node."""
    await add_user(mesh, "acme", "gw-sub", "pw-sub")
    token = await tenant_token(mesh, "acme")
    sub = subscriber(mesh, 1, "acme/gw-sub", "pw-sub", "gw/http/#")
    try:
        url = mesh.gateway_http
        async with aiohttp.ClientSession(url) as http:
            ids = []
            for i in range(20):
                body = {"topic": "gw/http/one", "payload": f"single-{i}", "qos": 1}
                status, answer, _ = await post(http, PUBLISH, body, bearer(token))
                assert status == 200, answer
                ids.append(answer["id"])
            bulk = [{"topic": "gw/http/bulk", "payload": f"bulk-{i}", "qos": 1} for i in range(20)]
            status, answer, _ = await post(http, BULK, bulk, bearer(token))
            assert status == 200, answer
            assert len(answer) == 20
            ids += [a["id"] for a in answer]
        assert len(set(ids)) == 40
        got = await asyncio.to_thread(sub.expect, 40)
        payloads = sorted(m.payload.decode() for m in got)
        want = sorted([f"single-{i}" for i in range(20)] + [f"bulk-{i}" for i in range(20)])
        assert payloads == want
        assert all(m.qos == 1 for m in got)
        await asyncio.to_thread(sub.nothing, 0.5)
    finally:
        sub.close()


async def test_no_token_401_and_wildcard_400(mesh: MeshInfo) -> None:
    token = await tenant_token(mesh, "acme")
    async with aiohttp.ClientSession(mesh.gateway_http) as http:
        body = {"topic": "gw/x", "payload": "p"}
        status, answer, resp = await post(http, PUBLISH, body, {})
        assert status == 401, answer
        assert "Bearer" in resp.headers["WWW-Authenticate"]
        status, answer, _ = await post(http, PUBLISH, body, bearer("stk_nope_nope"))
        assert status == 401, answer
        wild = {"topic": "gw/+/x", "payload": "p"}
        status, answer, _ = await post(http, PUBLISH, wild, bearer(token))
        assert status == 400 and "wildcard" in answer["message"], answer
        assert answer["code"] == "BAD_REQUEST"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"payload": "p"}, "topic is required"),
        ({"topic": "a", "payload": "!!", "payload_encoding": "base64"}, "base64"),
        ({"topic": "a", "payload": "p", "payload_encoding": "hex"}, "payload_encoding"),
        ({"topic": "a", "payload": "p", "qos": 3}, "qos"),
        ({"topic": "a", "payload": "p", "retain": "yes"}, "retain"),
        ({"topic": "a", "payload": "p", "colour": "red"}, "unknown field"),
        ({"topic": "$SYS/x", "payload": "p"}, "$SYS"),
        ({"topic": "a", "payload": 5}, "payload must be a string"),
        ({"topic": "a", "payload": "p", "properties": {"user_properties": [1]}}, "user_prop"),
        ([], "must be a JSON object"),
    ],
)
async def test_bad_input_400(mesh: MeshInfo, body: object, reason: str) -> None:
    token = await tenant_token(mesh, "acme")
    async with aiohttp.ClientSession(mesh.gateway_http) as http:
        status, answer, _ = await post(http, PUBLISH, body, bearer(token))
    assert status == 400, answer
    assert reason in answer["message"], answer


async def test_bad_json_bulk_and_oversized_body(mesh: MeshInfo) -> None:
    token = await tenant_token(mesh, "acme")
    async with aiohttp.ClientSession(mesh.gateway_http) as http:
        async with http.post(PUBLISH, data=b"{not json", headers=bearer(token)) as resp:
            assert resp.status == 400
            assert "not JSON" in (await resp.json())["message"]
        bulk = [{"topic": "ok", "payload": "p"}, {"topic": "bad/#", "payload": "p"}]
        status, answer, _ = await post(http, BULK, bulk, bearer(token))
        assert status == 400 and answer["message"].startswith("[1]:"), answer
        status, answer, _ = await post(http, BULK, [], bearer(token))
        assert status == 400, answer
        huge = {"topic": "a", "payload": "x" * (2 << 20)}
        status, answer, _ = await post(http, PUBLISH, huge, bearer(token))
        assert status == 413, answer


async def test_basic_auth_acl_refusal_403(mesh: MeshInfo) -> None:
    """A user's MQTT credentials (Basic) publish where its ACL allows, 403 elsewhere; a
    wrong password is 401."""
    tenant = unique("gwacl")
    await add_user(mesh, tenant, "dev", "pw-dev")
    from tests.e2e.admin import Admin

    Admin(mesh).acl(tenant, ("allow", "pub", "open/#"), ("deny", "all", "#"))
    url = mesh.gateway_http
    async with aiohttp.ClientSession(url) as http:
        creds = basic(f"{tenant}/dev", "pw-dev")
        status, answer, _ = await post(http, PUBLISH, {"topic": "open/a", "payload": "p"}, creds)
        assert status == 200, answer
        status, answer, _ = await post(http, PUBLISH, {"topic": "shut/a", "payload": "p"}, creds)
        assert status == 403 and "not authorized" in answer["message"], answer
        wrong = basic(f"{tenant}/dev", "nope")
        status, answer, _ = await post(http, PUBLISH, {"topic": "open/a", "payload": "p"}, wrong)
        assert status == 401, answer


async def test_tenant_scopes(mesh: MeshInfo) -> None:
    """A tenant token publishes to its own tenant only; the operator token names the
    tenant, and without one it is a 400."""
    token = await tenant_token(mesh, "acme")
    sub = subscriber(mesh, 0, "default-user", "x", "gw/scoped")  # anonymous tenant default
    try:
        async with aiohttp.ClientSession(mesh.gateway_http) as http:
            other = {"topic": "gw/scoped", "payload": "p", "tenant": "default"}
            status, answer, _ = await post(http, PUBLISH, other, bearer(token))
            assert status == 403, answer
            status, answer, _ = await post(
                http, PUBLISH, {"topic": "gw/scoped", "payload": "p"}, bearer(ADMIN_TOKEN)
            )
            assert status == 400 and "tenant" in answer["message"], answer
            status, answer, _ = await post(http, PUBLISH, other, bearer(ADMIN_TOKEN))
            assert status == 200, answer
        got = await asyncio.to_thread(sub.expect, 1)
        assert got[0].payload == b"p"
    finally:
        sub.close()


async def test_properties_and_base64_reach_mqtt5(mesh: MeshInfo) -> None:
    await add_user(mesh, "acme", "gw-props", "pw")
    token = await tenant_token(mesh, "acme")
    sub = subscriber(mesh, 0, "acme/gw-props", "pw", "gw/props")
    try:
        body = {
            "topic": "gw/props",
            "payload": base64.b64encode(b"\x00\xffbin").decode(),
            "payload_encoding": "base64",
            "qos": 1,
            "properties": {
                "user_properties": {"k": "v"},
                "content_type": "application/octet-stream",
                "response_topic": "gw/reply",
                "correlation_data": "c-1",
                "message_expiry_interval": 60,
            },
        }
        async with aiohttp.ClientSession(mesh.gateway_http) as http:
            status, answer, _ = await post(http, PUBLISH, body, bearer(token))
        assert status == 200, answer
        (m,) = await asyncio.to_thread(sub.expect, 1)
        assert m.payload == b"\x00\xffbin"
        props = m.properties
        assert props.UserProperty == [("k", "v")]
        assert props.ContentType == "application/octet-stream"
        assert props.ResponseTopic == "gw/reply"
        assert props.CorrelationData == b"c-1"
        assert 0 < props.MessageExpiryInterval <= 60
    finally:
        sub.close()


async def test_quota_refusal_429_with_retry_after(mesh: MeshInfo) -> None:
    """A tenant limited to 5 messages a second: 3 pass, a bulk of 10 more in that second is
    refused with 429 and Retry-After (and nothing of it published), and once the window
    has passed 3 pass again."""
    tenant = unique("gwq")
    admin = QuotaAdminClient(mesh.addr("quota"), ADMIN_TOKEN)
    try:
        await admin.set_limits(tenant, Limits(max_messages_per_s=5))
    finally:
        await admin.close()
    await add_user(mesh, tenant, "s", "pw-s")
    sub = subscriber(mesh, 0, f"{tenant}/s", "pw-s", "q/#")

    def bulk(n: int) -> list[dict[str, object]]:
        return [{"topic": "q/a", "payload": str(i), "tenant": tenant} for i in range(n)]

    try:
        async with aiohttp.ClientSession(mesh.gateway_http) as http:

            async def three_pass() -> bool:
                return (await post(http, BULK, bulk(3), bearer(ADMIN_TOKEN)))[0] == 200

            await eventually(three_pass, 5, "3 publishes within the limit")
            status, answer, resp = await post(http, BULK, bulk(10), bearer(ADMIN_TOKEN))
            assert status == 429, answer
            assert 1 <= int(resp.headers["Retry-After"]) <= 1
            assert "quota" in answer["message"]
            await eventually(three_pass, 5, "3 publishes in a later window")
        got = await asyncio.to_thread(sub.expect, 6)
        assert sorted(m.payload for m in got) == [b"0", b"0", b"1", b"1", b"2", b"2"]
        await asyncio.to_thread(sub.nothing, 0.3)
    finally:
        sub.close()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_basic_auth_and_https(mesh: MeshInfo) -> None:
    """curl, as an operator's script would call it: Basic auth, over HTTP and HTTPS."""
    tenant = unique("gwcurl")
    await add_user(mesh, tenant, "c", "pw-c")
    body = json.dumps({"topic": "curl/t", "payload": "hi", "qos": 1})
    for base, extra in (
        (mesh.gateway_http, []),
        (mesh.gateway_https, ["--cacert", str(mesh.cert)]),
    ):
        out = await asyncio.to_thread(
            subprocess.run,
            [
                "curl",
                "-sS",
                "-u",
                f"{tenant}/c:pw-c",
                "-H",
                "Content-Type: application/json",
                "-d",
                body,
                "-w",
                "\n%{http_code}",
                *extra,
                base + PUBLISH,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        text, _, code = out.stdout.rpartition("\n")
        assert code == "200", out
        assert json.loads(text)["id"]


async def test_https_with_aiohttp(mesh: MeshInfo) -> None:
    token = await tenant_token(mesh, "acme")
    ctx = ssl.create_default_context(cafile=str(mesh.cert))
    async with aiohttp.ClientSession(
        mesh.gateway_https, connector=aiohttp.TCPConnector(ssl=ctx)
    ) as http:
        status, answer, _ = await post(
            http, PUBLISH, {"topic": "tls/t", "payload": "p"}, bearer(token)
        )
    assert status == 200, answer
