"""The authenticators of a tenant's chain: JWT (HS256, RS256, ES256; PEM, JWKS file, JWKS
URL), an HTTP auth service (real aiohttp servers), client certificates, and the chain."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from services.common.acl import Access, AclRule
from services.common.mqtt.reason import ReasonCode as RC
from services.session.authenticators.cert import CertAuthenticator
from services.session.authenticators.chain import Chains
from services.session.authenticators.http_auth import HttpAuthConfig, HttpAuthenticator
from services.session.authenticators.jwt_auth import JwtAuthenticator, JwtConfig
from services.session.verdict import IGNORE, Decision, Presented, Verdict, allow, deny

ALGS = ("HS256", "RS256", "ES256")


def presented(password: bytes | None = None, **kw: Any) -> Presented:
    fields: dict[str, Any] = {
        "tenant": "acme",
        "name": "dev",
        "username": "acme/dev",
        "password": password,
        "client_id": "c1",
        "peer_address": "10.1.2.3:4000",
        "tenant_named": True,
    }
    fields.update(kw)
    return Presented(**fields)


def token(key: Any, alg: str, kid: str | None = None, **claims: Any) -> bytes:
    body = {"sub": "dev", "exp": int(time.time()) + 60, **claims}
    headers = {"kid": kid} if kid else None
    return jwt.encode(body, key, algorithm=alg, headers=headers).encode()


async def test_jwt_hs256_claims_map_to_user_tenant_and_acl() -> None:
    auth = JwtAuthenticator(JwtConfig(ALGS, secret="k" * 64))
    acl = [{"permission": "allow", "action": "publish", "topic": "d/%u/#"}]
    v = await auth.authenticate(presented(token("k" * 64, "HS256", tenant="acme", acl=acl)))
    assert v == allow("dev", "acme", (AclRule(True, Access.PUBLISH, "d/%u/#"),))
    v = await auth.authenticate(presented(token("k" * 64, "HS256", sub="other/bob")))
    assert (v.decision, v.tenant, v.name) == (Decision.ALLOW, "other", "bob")


@pytest.mark.parametrize(
    ("make", "code"),
    [
        pytest.param(
            lambda: token("x" * 64, "HS256"), RC.BAD_USER_NAME_OR_PASSWORD, id="wrong-key"
        ),
        pytest.param(
            lambda: token("k" * 64, "HS256", exp=int(time.time()) - 5),
            RC.BAD_USER_NAME_OR_PASSWORD,
            id="expired",
        ),
        pytest.param(
            lambda: jwt.encode({"sub": "dev"}, "k" * 64, "HS256").encode(),
            RC.BAD_USER_NAME_OR_PASSWORD,
            id="no-exp",
        ),
        pytest.param(
            lambda: token("k" * 64, "HS512"), RC.BAD_USER_NAME_OR_PASSWORD, id="alg-not-accepted"
        ),
        pytest.param(
            lambda: token("k" * 64, "HS256", acl=[{"permission": "allow"}]),
            RC.NOT_AUTHORIZED,
            id="bad-acl-claim",
        ),
        pytest.param(
            lambda: token("k" * 64, "HS256", sub="a/dev", tenant="b"),
            RC.NOT_AUTHORIZED,
            id="two-tenants",
        ),
    ],
)
async def test_jwt_refusals(make: Callable[[], bytes], code: int) -> None:
    auth = JwtAuthenticator(JwtConfig(ALGS, secret="k" * 64))
    v = await auth.authenticate(presented(make()))
    assert (v.decision, v.reason_code) == (Decision.DENY, code)


async def test_a_password_that_is_no_jwt_is_not_the_jwt_authenticators() -> None:
    auth = JwtAuthenticator(JwtConfig(ALGS, secret="k" * 64))
    for password in (None, b"hunter2", b"a.b.c", b"\xff.\xff.\xff"):
        assert await auth.authenticate(presented(password)) == IGNORE


async def test_jwt_rs256_with_a_pem_key_and_es256_with_a_jwks_file(tmp_path: Path) -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = tmp_path / "rsa.pem"
    pem.write_bytes(
        rsa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    auth = JwtAuthenticator(JwtConfig(ALGS, public_key_file=pem))
    assert (await auth.authenticate(presented(token(rsa_key, "RS256")))).decision is Decision.ALLOW
    # An HS256 token signed with the public key's text must not pass as its own secret.
    forged = token(pem.read_bytes().decode()[:40] * 2, "HS256")
    assert (await auth.authenticate(presented(forged))).decision is Decision.DENY

    ec_key = ec.generate_private_key(ec.SECP256R1())
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "ES256"}]}))
    auth = JwtAuthenticator(JwtConfig(ALGS, public_key_file=jwks))
    ok = await auth.authenticate(presented(token(ec_key, "ES256", kid="k1")))
    assert ok.decision is Decision.ALLOW
    other = ec.generate_private_key(ec.SECP256R1())
    bad = await auth.authenticate(presented(token(other, "ES256", kid="k1")))
    assert bad.decision is Decision.DENY


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def http_server() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_route("*", "/", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}/"

    yield start
    for r in runners:
        await r.cleanup()


async def test_jwks_url_is_fetched_once_and_again_for_a_new_kid(
    http_server: Callable[[Handler], Awaitable[str]],
) -> None:
    keys = {"k1": ec.generate_private_key(ec.SECP256R1())}
    fetches = 0

    async def jwks(request: web.Request) -> web.Response:
        nonlocal fetches
        fetches += 1
        docs = [
            {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(k.public_key())), "kid": kid}
            for kid, k in keys.items()
        ]
        return web.json_response({"keys": docs})

    url = await http_server(jwks)
    auth = JwtAuthenticator(JwtConfig(ALGS, jwks_url=url, jwks_cache_s=300))
    for _ in range(3):
        v = await auth.authenticate(presented(token(keys["k1"], "ES256", kid="k1")))
        assert v.decision is Decision.ALLOW
    assert fetches == 1  # cached
    keys["k2"] = ec.generate_private_key(ec.SECP256R1())
    # A kid we do not know yet is looked up again, but not more often than every 10 s.
    v = await auth.authenticate(presented(token(keys["k2"], "ES256", kid="k2")))
    assert v.decision is Decision.DENY and fetches == 1


async def test_http_auth_allow_deny_cache_and_what_it_was_sent(
    http_server: Callable[[Handler], Awaitable[str]],
) -> None:
    seen: list[dict[str, Any]] = []

    async def service(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        if body["password"] == "good":
            acl = [{"permission": "deny", "action": "all", "topic": "secret/#"}]
            return web.json_response({"result": "allow", "acl": acl, "username": "dev-1"})
        if body["password"] == "other":
            return web.json_response({"result": "ignore"})
        return web.json_response({"result": "deny"})

    auth = HttpAuthenticator(HttpAuthConfig(await http_server(service), cache_ttl_s=60))
    try:
        good = presented(b"good", cert_common_name="cn-1")
        v = await auth.authenticate(good)
        assert v == allow("dev-1", "", (AclRule(False, Access.ALL, "secret/#"),))
        assert seen[0] == {
            "tenant": "acme",
            "username": "acme/dev",
            "password": "good",
            "client_id": "c1",
            "cert_common_name": "cn-1",
            "peer_address": "10.1.2.3:4000",
        }
        # Same credential from another port of the same address: cached, not asked again.
        assert (
            await auth.authenticate(
                presented(b"good", cert_common_name="cn-1", peer_address="10.1.2.3:4001")
            )
            == v
        )
        assert len(seen) == 1
        bad = await auth.authenticate(presented(b"bad"))
        assert (bad.decision, bad.reason_code) == (Decision.DENY, RC.BAD_USER_NAME_OR_PASSWORD)
        assert await auth.authenticate(presented(b"other")) == IGNORE
    finally:
        await auth.close()


@pytest.mark.parametrize(
    ("on_timeout", "expected"),
    [
        ("unavailable", (Decision.DENY, RC.SERVER_UNAVAILABLE)),
        ("deny", (Decision.DENY, RC.NOT_AUTHORIZED)),
        ("ignore", (Decision.IGNORE, RC.BAD_USER_NAME_OR_PASSWORD)),
    ],
)
async def test_http_auth_timeout_and_errors_follow_the_setting_and_are_not_cached(
    http_server: Callable[[Handler], Awaitable[str]],
    on_timeout: str,
    expected: tuple[Decision, int],
) -> None:
    calls = 0
    slow = True

    async def service(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        if slow:
            await asyncio.sleep(1.0)
        return web.json_response({"result": "allow"})

    cfg = HttpAuthConfig(await http_server(service), timeout_s=0.2, on_timeout=on_timeout)
    auth = HttpAuthenticator(cfg)
    try:
        v = await auth.authenticate(presented(b"pw"))
        assert (v.decision, v.reason_code) == expected
        slow = False
        assert (await auth.authenticate(presented(b"pw"))).decision is Decision.ALLOW
        assert calls == 2
    finally:
        await auth.close()

    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=500, text="oops")

    auth = HttpAuthenticator(HttpAuthConfig(await http_server(broken)))
    try:
        v = await auth.authenticate(presented(b"pw"))
        assert (v.decision, v.reason_code) == (Decision.DENY, RC.SERVER_UNAVAILABLE)
    finally:
        await auth.close()


async def test_certificate_identity_from_cn_or_san() -> None:
    cn = CertAuthenticator("cn")
    assert await cn.authenticate(presented()) == IGNORE  # no certificate
    assert await cn.authenticate(presented(cert_common_name="sensor-1")) == allow("sensor-1")
    assert await cn.authenticate(presented(cert_common_name="acme/s-2")) == allow("s-2", "acme")
    san = CertAuthenticator("san_dns")
    sans = ("email:x@y", "DNS:gw-7.example")
    assert await san.authenticate(presented(cert_subject_alt_names=sans)) == allow("gw-7.example")
    bad = await cn.authenticate(presented(cert_common_name="bad tenant!/x"))
    assert (bad.decision, bad.reason_code) == (Decision.DENY, RC.NOT_AUTHORIZED)


class Fixed:
    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self.calls = 0

    async def authenticate(self, p: Presented) -> Verdict:
        self.calls += 1
        return self.verdict


async def test_chain_order_first_decision_wins_and_tenants_must_agree() -> None:
    ignore, yes, no = Fixed(IGNORE), Fixed(allow("dev")), Fixed(deny("no"))
    chains = Chains(
        {"acme": ["a", "scram", "b", "c"], "*": ["c"]}, {"a": ignore, "b": yes, "c": no}
    )
    assert chains.names("acme") == ["a", "scram", "b", "c"]
    assert chains.names("zzz") == ["c"]
    assert (await chains.authenticate(presented())) == allow("dev")
    assert (ignore.calls, yes.calls, no.calls) == (1, 1, 0)
    assert (await chains.authenticate(presented(tenant="zzz"))).decision is Decision.DENY
    elsewhere = Chains({"*": ["x"]}, {"x": Fixed(allow("dev", "other"))})
    v = await elsewhere.authenticate(presented())
    assert (v.decision, v.reason_code) == (Decision.DENY, RC.NOT_AUTHORIZED)
    # No tenant in the user name: the credential's tenant is taken.
    v = await elsewhere.authenticate(presented(tenant="default", tenant_named=False))
    assert v == allow("dev", "other")
