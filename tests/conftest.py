"""Fixtures that start real servers on free ports: nats-server, redis-server, the core
services in this process (client tests), and a whole Starling mesh (two connection nodes)
shared by the end-to-end tests of a session.

NATS and Redis require credentials here as in production; their URLs carry them
(`nats://user:password@...`, `redis://:password@...`), which every client accepts.
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from services.cli.forked import start_server
from services.cli.launcher import Launcher, Mesh, nats_binary
from services.cli.ports import default_range, free_port, port_open
from tests import figures, spark_jvm
from tests.faults.harness import table_lines as faults_table
from tests.partitions.run import table_lines as partitions_table
from tests.poll import wait_until
from tests.scheduling import UnitScheduling, longest_first

if TYPE_CHECKING:
    from tests.inproc import Core

ADMIN_TOKEN = "test-admin-token"
NATS_USER, NATS_PASSWORD = "tests", "tests-nats-password"
REDIS_PASSWORD = "tests-redis-password"


def pytest_configure(config: pytest.Config) -> None:
    """Every process that runs tests starts meshes from a fork server of its own (services/
    cli/forkserver.py: a mesh starts in about a second and a fifth of the CPU); parallel
    workers each pick ports from their own slice of the free-port range (services/cli/
    ports.py), inherited by the meshes they start. Spark JVMs start cheaply (tests/
    spark_jvm.py)."""
    spark_jvm.use()
    if not getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput"):
        _start_fork_server(config)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or "STARLING_PORT_RANGE" in os.environ:
        return
    index, count = int(worker[2:]), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    low, high = default_range()
    span = (high - low) // max(count, 1)
    os.environ["STARLING_PORT_RANGE"] = f"{low + index * span}-{low + (index + 1) * span - 1}"


def _start_fork_server(config: pytest.Config) -> None:
    """`STARLING_FORK_SERVER=off` spawns every service fresh, as `starling up` does."""
    if os.environ.get("STARLING_FORK_SERVER") == "off":
        del os.environ["STARLING_FORK_SERVER"]
        return
    if os.environ.get("STARLING_FORK_SERVER") or config.option.collectonly:
        return
    folder = Path(tempfile.mkdtemp(prefix="starling-fork-"))
    server = start_server(folder / "fork.sock")
    os.environ["STARLING_FORK_SERVER"] = str(folder / "fork.sock")
    config.add_cleanup(lambda: _stop(server, folder))


def _stop(server: subprocess.Popen[bytes], folder: Path) -> None:
    os.environ.pop("STARLING_FORK_SERVER", None)
    server.terminate()
    server.wait(10)
    shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker (`make test` runs `--dist loadfile`: each file whole on one
    worker), the files go out longest first (tests/scheduling.py)."""
    if hasattr(config, "workerinput"):
        longest_first(items)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` hands out units of tests/scheduling.py (a file, or a folder that
    runs together); any other mode is pytest-xdist's own."""
    return UnitScheduling(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    figures.collect(report)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The fault and partition suites' figure tables (tests/figures.py)."""
    figures.print_table(terminalreporter, "fault", "fault suite figures", faults_table)
    figures.print_table(terminalreporter, "partition", "partition suite figures", partitions_table)


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, within_s: float = 20) -> None:
    """Until `proc` listens on `port`; RuntimeError at once if it exits."""

    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        return port_open("127.0.0.1", port)

    wait_until(listening, within_s, f"{what} to open port {port}", every_s=0.02)


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    store = tmp_path_factory.mktemp("nats")
    conf = store / "nats.conf"
    conf.write_text(
        f'listen: "127.0.0.1:{port}"\njetstream {{ store_dir: "{store}" }}\n'
        f'authorization {{ user: "{NATS_USER}", password: "{NATS_PASSWORD}" }}\n'
    )
    proc = subprocess.Popen(
        [nats_binary(), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port, proc, "nats-server")
    yield f"nats://{NATS_USER}:{NATS_PASSWORD}@127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed; run `make test` (scripts/setup.sh installs it)")
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path_factory.mktemp("redis")),
            "--requirepass",
            REDIS_PASSWORD,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port, proc, "redis-server")
    yield f"redis://:{REDIS_PASSWORD}@127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="session")
async def core(
    nats_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Core]:
    """Queue, router, session and metrics services in this process, shared by the client
    tests of a session (each test uses its own tenant)."""
    from tests.inproc import core_services

    async with core_services(nats_url, redis_url, tmp_path_factory.mktemp("core")) as c:
        yield c


def make_cert(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1/localhost."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@dataclass
class MeshInfo:
    mesh: Mesh
    launcher: Launcher
    cert: Path

    def node(self, i: int) -> int:
        return self.mesh.by_name(f"connection-{i}").port

    def addr(self, name: str) -> str:
        return f"127.0.0.1:{self.mesh.by_name(name).grpc_port}"

    @property
    def gateway_http(self) -> str:
        """The gateway's HTTP API base URL (`http://127.0.0.1:PORT`)."""
        return f"http://127.0.0.1:{self.mesh.by_name('gateway').port}"

    @property
    def gateway_https(self) -> str:
        """The same API over TLS (the mesh's certificate, `cert`)."""
        return f"https://127.0.0.1:{self.mesh.by_name('gateway').tls_port}"

    @property
    def gateway_coap(self) -> str:
        """The gateway's CoAP base URI (`coap://127.0.0.1:PORT`)."""
        return f"coap://127.0.0.1:{self.mesh.by_name('gateway').coap_port}"

    @property
    def nats_url(self) -> str:
        """The mesh's NATS as its full-access `operator` user (tools and tests)."""
        password = self.launcher.secrets.nats["operator"]
        return f"nats://operator:{password}@127.0.0.1:{self.mesh.by_name('nats').port}"

    def logs(self) -> list[Path]:
        return sorted((Path(self.mesh.data_dir) / "logs").glob("*.log"))


@pytest.fixture(scope="session")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeshInfo]:
    """Two connection nodes plus every service (the gateway too: tests/gateway), shared by
    all end-to-end tests."""
    folder = tmp_path_factory.mktemp("mesh")
    cert, key = make_cert(folder)
    env = {
        "STARLING_ANONYMOUS_TENANTS": '["default", "open", "traced"]',
        # Every message of tenant "traced" is traced (tests/e2e/test_trace_files.py); the
        # spans go to <data dir>/traces/<process>.jsonl (the launcher's default).
        "STARLING_TRACE_SAMPLE_TENANTS": '{"traced": 1.0}',
        "STARLING_ADMIN_TOKEN": ADMIN_TOKEN,
        "STARLING_LOG_LEVEL": "INFO",
        "STARLING_MAX_QUEUED_MESSAGES": "100",
        "STARLING_RECEIVE_MAXIMUM": "20",
        "STARLING_STATS_INTERVAL_S": "0.5",
        # `$SYS` refreshed every second; tenant "sysop" sees the cluster (test_sys_topics.py).
        "STARLING_SYS_INTERVAL_S": "1",
        "STARLING_SYS_OPERATOR_TENANT": "sysop",
        # A killed rules instance's unacknowledged batch comes back after this (tests/rules).
        "STARLING_RULES_ACK_WAIT_S": "5",
        # Flapping bans are tested here (tests/quota); the launcher's default profile has none.
        "STARLING_FLAPPING_ENABLED": "true",
        # Server redirection (tests/conformance): tenants served by another server.
        "STARLING_REDIRECTS": '{"moved": {"server_reference": "new.example:1883", "moved": true},'
        ' "busy": {"server_reference": "other.example:1883"}}',
    }
    launcher = Launcher(
        data_dir=folder / "run",
        nodes=2,
        mqtt_port=0,
        anonymous=False,
        extra_env=env,
        tls=(cert, key),
    )
    m = launcher.start(timeout_s=60)
    yield MeshInfo(m, launcher, cert)
    launcher.stop()
