"""Every way to prove who you are, end to end (issue 12): a JWT client, an HTTP-auth client,
an mTLS client identified by its certificate and a SCRAM client (with re-authentication) each
connect, and each is refused with the right reason code when its credential is wrong.

A one-node mesh of its own: tenants `jwtt` (chain [jwt, password]), `httpt` ([http]),
`certt` ([cert]); every other tenant [password, scram]. The HTTP auth service is a real
aiohttp server in this process; the client CA is made here with `cryptography`.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.cli.launcher import Launcher
from services.cli.ports import free_port
from services.common.mqtt import ConnAck, Connect, Properties, encode
from services.common.mqtt.packets import Auth, Disconnect, PubAck, Publish
from services.common.mqtt.reason import ReasonCode as RC
from starling.session.v1 import session_pb2 as pb
from starling.session.v1 import session_pb2_grpc as pb_grpc
from tests.conftest import ADMIN_TOKEN, make_cert
from tests.e2e.admin import MD
from tests.e2e.clients import Paho, Raw
from tests.scram_client import ScramClient

JWT_SECRET = "jwt-test-secret-" + "x" * 48


class HttpAuthService(threading.Thread):
    """A real aiohttp auth service: password "open-sesame" is allowed (as user "dev-<id>",
    with an ACL), anything else denied."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.requests: list[dict[str, Any]] = []
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if body["password"] != "open-sesame":
            return web.json_response({"result": "deny"})
        acl = [
            {"permission": "allow", "action": "publish", "topic": "http/%u/#"},
            {"permission": "deny", "action": "publish", "topic": "#"},
        ]
        return web.json_response({"result": "allow", "username": "dev-1", "acl": acl})

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/auth", self.handle)
        runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.join(5)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(folder: Path, name: str) -> tuple[Path, ec.EllipticCurvePrivateKey, x509.Name]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = folder / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, key, cert.subject


def make_client_cert(
    folder: Path, ca_key: ec.EllipticCurvePrivateKey, ca_name: x509.Name, cn: str
) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(ca_key, hashes.SHA256())
    )
    stem = uuid.uuid4().hex[:8]
    cert_path, key_path = folder / f"{stem}.crt", folder / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


@dataclass
class AuthMesh:
    launcher: Launcher
    folder: Path
    server_cert: Path
    ca_key: ec.EllipticCurvePrivateKey
    ca_name: x509.Name
    http: HttpAuthService
    admin: pb_grpc.SessionAdminServiceStub

    @property
    def port(self) -> int:
        return self.launcher.mesh.by_name("connection-0").port

    @property
    def tls_port(self) -> int:
        return self.launcher.mesh.by_name("connection-0").tls_port

    def acl(self, tenant: str, *rules: tuple[int, int, str]) -> None:
        self.admin.SetAcl(
            pb.SetAclRequest(
                tenant=tenant,
                rules=[pb.AclRule(permission=p, action=a, topic_filter=f) for p, a, f in rules],
            ),
            metadata=MD,
        )


@pytest.fixture(scope="module")
def auth_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthMesh]:
    folder = tmp_path_factory.mktemp("auth-methods")
    server_cert, server_key = make_cert(folder)
    ca_path, ca_key, ca_name = make_ca(folder, "client-ca")
    http = HttpAuthService(free_port())
    http.start()
    assert http.ready.wait(10)
    chains = {"jwtt": ["jwt", "password"], "httpt": ["http"], "certt": ["cert"]}
    chains["*"] = ["password", "scram"]
    launcher = Launcher(
        data_dir=folder / "run",
        nodes=1,
        mqtt_port=0,
        anonymous=False,
        ws=False,
        tls=(server_cert, server_key),
        extra_env={
            "STARLING_ADMIN_TOKEN": ADMIN_TOKEN,
            "STARLING_AUTH_CHAIN": json.dumps(chains),
            "STARLING_JWT_SECRET": JWT_SECRET,
            "STARLING_HTTP_AUTH_URL": f"http://127.0.0.1:{http.port}/auth",
            "STARLING_TLS_CA_FILE": str(ca_path),
        },
    )
    launcher.start(timeout_s=60)
    session = launcher.mesh.by_name("session").grpc_port
    admin = pb_grpc.SessionAdminServiceStub(grpc.insecure_channel(f"127.0.0.1:{session}"))
    yield AuthMesh(launcher, folder, server_cert, ca_key, ca_name, http, admin)
    launcher.stop()
    http.stop()


def _pub_code(client: Paho, topic: str) -> int:
    return int(client.publish(topic, b"x", 1).value)


ALLOW, DENY = pb.PERMISSION_ALLOW, pb.PERMISSION_DENY
PUB = pb.ACL_ACTION_PUBLISH


def test_jwt_client_connects_with_its_claims_and_a_bad_token_is_refused(
    auth_mesh: AuthMesh,
) -> None:
    claims = {
        "sub": "sensor-9",
        "tenant": "jwtt",
        "exp": int(time.time()) + 300,
        "acl": [
            {"permission": "allow", "action": "publish", "topic": "jwt/%u/#"},
            {"permission": "deny", "action": "publish", "topic": "#"},
        ],
    }
    good = jwt.encode(claims, JWT_SECRET, algorithm="HS256")
    client = Paho(auth_mesh.port, username="jwtt/anyone", password=good)
    client.connect()
    assert _pub_code(client, "jwt/sensor-9/t") == 0  # %u is the token's subject
    assert _pub_code(client, "jwt/anyone/t") == RC.NOT_AUTHORIZED
    client.close()
    for bad in (
        jwt.encode(claims, "another-secret-" + "y" * 48, algorithm="HS256"),
        jwt.encode({**claims, "exp": int(time.time()) - 10}, JWT_SECRET, algorithm="HS256"),
    ):
        refused = Paho(auth_mesh.port, username="jwtt/anyone", password=bad)
        assert int(refused.connect(expect_ok=False).value) == RC.BAD_USER_NAME_OR_PASSWORD
        refused.c.loop_stop()
    # A token for another tenant than the user name names: not authorized.
    elsewhere = jwt.encode({**claims, "tenant": "other"}, JWT_SECRET, algorithm="HS256")
    refused = Paho(auth_mesh.port, username="jwtt/anyone", password=elsewhere)
    assert int(refused.connect(expect_ok=False).value) == RC.NOT_AUTHORIZED
    refused.c.loop_stop()
    # The chain goes on to passwords for what is not a JWT.
    auth_mesh.admin.CreateUser(
        pb.CreateUserRequest(tenant="jwtt", username="legacy", password="pw"), metadata=MD
    )
    legacy = Paho(auth_mesh.port, username="jwtt/legacy", password="pw")
    legacy.connect()
    legacy.close()


def test_http_auth_client_connects_and_a_denied_one_is_refused(auth_mesh: AuthMesh) -> None:
    cid = f"h-{uuid.uuid4().hex[:6]}"
    client = Paho(auth_mesh.port, client_id=cid, username="httpt/dev", password="open-sesame")
    client.connect()
    sent = auth_mesh.http.requests[-1]
    assert (sent["tenant"], sent["username"], sent["client_id"]) == ("httpt", "httpt/dev", cid)
    assert sent["peer_address"].startswith("127.0.0.1:")
    assert _pub_code(client, "http/dev-1/x") == 0  # the service named the user dev-1
    assert _pub_code(client, "http/dev/x") == RC.NOT_AUTHORIZED
    client.close()
    refused = Paho(auth_mesh.port, username="httpt/dev", password="wrong")
    assert int(refused.connect(expect_ok=False).value) == RC.BAD_USER_NAME_OR_PASSWORD
    refused.c.loop_stop()


def _tls_client(auth_mesh: AuthMesh, cert: tuple[str, str] | None, **kw: Any) -> Paho:
    client = Paho(auth_mesh.tls_port, **kw)
    client.c.tls_set(
        ca_certs=str(auth_mesh.server_cert),
        certfile=cert[0] if cert else None,
        keyfile=cert[1] if cert else None,
        cert_reqs=ssl.CERT_REQUIRED,
    )
    return client


def test_mtls_client_is_identified_by_its_certificate(auth_mesh: AuthMesh) -> None:
    auth_mesh.acl("certt", (ALLOW, PUB, "sensors/%u/#"), (DENY, PUB, "#"))
    cert = make_client_cert(auth_mesh.folder, auth_mesh.ca_key, auth_mesh.ca_name, "certt/s-1")
    client = _tls_client(auth_mesh, cert)  # no user name, no password: the certificate says
    client.connect()
    assert _pub_code(client, "sensors/s-1/temp") == 0
    assert _pub_code(client, "sensors/s-2/temp") == RC.NOT_AUTHORIZED
    client.close()
    # No certificate: the tenant's chain has nothing else to believe.
    bare = _tls_client(auth_mesh, None, username="certt/s-1")
    assert int(bare.connect(expect_ok=False).value) == RC.BAD_USER_NAME_OR_PASSWORD
    bare.c.loop_stop()
    # A certificate from a CA the server does not trust: the TLS handshake fails.
    _, rogue_key, rogue_name = make_ca(auth_mesh.folder, "rogue-ca")
    rogue = make_client_cert(auth_mesh.folder, rogue_key, rogue_name, "certt/s-1")
    ctx = ssl.create_default_context(cafile=str(auth_mesh.server_cert))
    ctx.load_cert_chain(*rogue)
    with (
        socket.create_connection(("127.0.0.1", auth_mesh.tls_port), timeout=10) as sock,
        ctx.wrap_socket(sock, server_hostname="127.0.0.1") as tls,
    ):
        try:  # TLS 1.3: the server's verdict on our certificate arrives after our handshake
            tls.sendall(encode(Connect("rogue", 5), 5))
            answer = tls.recv(64)
        except (ssl.SSLError, ConnectionError):
            answer = b""
    assert answer == b""  # no CONNACK: the handshake was refused


METHOD = "SCRAM-SHA-256"


def _scram_props(data: bytes, method: str = METHOD) -> Properties:
    return Properties(authentication_method=method, authentication_data=data)


def _scram_connect(
    port: int, username: str, password: str, method: str = METHOD
) -> tuple[Raw, Any]:
    raw = Raw(port)
    client = ScramClient(method, "", password)
    first = raw.connect(
        Connect(
            f"s-{uuid.uuid4().hex[:6]}",
            5,
            username=username,
            properties=_scram_props(client.first(), method),
        )
    )
    if isinstance(first, ConnAck):
        return raw, first
    assert isinstance(first, Auth) and first.reason_code == RC.CONTINUE_AUTHENTICATION
    assert first.properties.authentication_method == method
    raw.send(
        Auth(
            RC.CONTINUE_AUTHENTICATION,
            _scram_props(client.final(first.properties.authentication_data or b""), method),
        )
    )
    connack = raw.recv()
    if isinstance(connack, ConnAck) and connack.reason_code == 0:
        assert client.verify(connack.properties.authentication_data or b"")
    return raw, connack


def _reauth(raw: Raw, password: str) -> Any:
    client = ScramClient(METHOD, "", password)
    raw.send(Auth(RC.RE_AUTHENTICATE, _scram_props(client.first())))
    challenge = raw.recv()
    assert isinstance(challenge, Auth) and challenge.reason_code == RC.CONTINUE_AUTHENTICATION
    raw.send(
        Auth(
            RC.CONTINUE_AUTHENTICATION,
            _scram_props(client.final(challenge.properties.authentication_data or b"")),
        )
    )
    answer = raw.recv()
    if isinstance(answer, Auth):
        assert answer.reason_code == RC.SUCCESS
        assert client.verify(answer.properties.authentication_data or b"")
    return answer


@pytest.mark.parametrize("method", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_client_connects_and_a_wrong_password_is_refused(
    auth_mesh: AuthMesh, method: str
) -> None:
    tenant = f"sc{uuid.uuid4().hex[:6]}"
    auth_mesh.admin.CreateUser(
        pb.CreateUserRequest(tenant=tenant, username="dev", password="s3cret"), metadata=MD
    )
    raw, connack = _scram_connect(auth_mesh.port, f"{tenant}/dev", "s3cret", method)
    assert isinstance(connack, ConnAck) and connack.reason_code == 0
    assert connack.properties.authentication_method == method
    raw.close()
    raw, connack = _scram_connect(auth_mesh.port, f"{tenant}/dev", "guess", method)
    assert isinstance(connack, ConnAck) and connack.reason_code == RC.NOT_AUTHORIZED
    assert not connack.session_present
    assert raw.closed()
    raw = Raw(auth_mesh.port)
    props = _scram_props(b"n,,n=dev,r=abc", "SCRAM-MD5")
    connack = raw.connect(Connect("md5", 5, username=f"{tenant}/dev", properties=props))
    assert isinstance(connack, ConnAck) and connack.reason_code == RC.BAD_AUTHENTICATION_METHOD
    assert raw.closed()


def test_scram_reauthentication_on_a_live_connection(auth_mesh: AuthMesh) -> None:
    tenant = f"sc{uuid.uuid4().hex[:6]}"
    auth_mesh.admin.CreateUser(
        pb.CreateUserRequest(tenant=tenant, username="dev", password="pw1"), metadata=MD
    )
    raw, connack = _scram_connect(auth_mesh.port, f"{tenant}/dev", "pw1")
    assert isinstance(connack, ConnAck) and connack.reason_code == 0
    assert isinstance(_reauth(raw, "pw1"), Auth)
    raw.send(Publish("a/b", b"still here", qos=1, packet_id=7))
    assert raw.recv() == PubAck(7)
    # The password changes; re-authenticating with the old one ends the connection.
    auth_mesh.admin.CreateUser(
        pb.CreateUserRequest(tenant=tenant, username="dev", password="pw2"), metadata=MD
    )
    refused = _reauth(raw, "pw1")
    assert isinstance(refused, Disconnect) and refused.reason_code == RC.NOT_AUTHORIZED
    assert raw.closed()
