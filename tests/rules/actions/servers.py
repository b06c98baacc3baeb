"""Real targets started by the action tests on free ports: Mosquitto (with a password and a
TLS listener) and RabbitMQ. Each is stopped by its fixture."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.cli.ports import free_port
from tests.conftest import make_cert, wait_port

MQTT_USER, MQTT_PASSWORD = "bridge", "bridge-password"


@dataclass
class Mosquitto:
    folder: Path
    port: int
    tls_port: int
    cert: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("mosquitto")
        if binary is None:
            pytest.skip("mosquitto is not installed (scripts/setup.sh installs it)")
        self.proc = subprocess.Popen(
            [binary, "-c", str(self.folder / "mosquitto.conf")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, self.proc, "mosquitto")
        wait_port(self.tls_port, self.proc, "mosquitto (TLS)")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


def mosquitto(folder: Path) -> Mosquitto:
    """A configured (not started) Mosquitto: a password-protected plain listener and a TLS
    one with a self-signed certificate for 127.0.0.1."""
    cert, key = make_cert(folder)
    passwords = folder / "passwd"
    passwords.write_text("")
    subprocess.run(
        ["mosquitto_passwd", "-b", str(passwords), MQTT_USER, MQTT_PASSWORD],
        check=True,
        capture_output=True,
    )
    passwords.chmod(0o600)
    port, tls_port = free_port(), free_port()
    (folder / "mosquitto.conf").write_text(
        "per_listener_settings false\n"
        # Started as root it would switch to the mosquitto user, who cannot read a pytest
        # temp folder; as another user the option is ignored.
        "user root\n"
        "allow_anonymous false\n"
        f"password_file {passwords}\n"
        "persistence false\n"
        "max_inflight_messages 20\n"
        f"listener {port} 127.0.0.1\n"
        f"listener {tls_port} 127.0.0.1\n"
        f"certfile {cert}\nkeyfile {key}\n"
    )
    return Mosquitto(folder, port, tls_port, cert)


@dataclass
class Rabbit:
    url: str
    proc: subprocess.Popen[bytes]
    epmd: subprocess.Popen[bytes]

    def stop(self) -> None:
        for proc in (self.proc, self.epmd):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def rabbitmq(folder: Path) -> Rabbit:
    """Debian's rabbitmq-server in `folder` on free ports (its own epmd port too)."""
    # The script itself, not Debian's wrapper in /usr/sbin (which switches to the rabbitmq
    # user, who cannot read a pytest temp folder).
    binary = "/usr/lib/rabbitmq/bin/rabbitmq-server"
    epmd_binary = shutil.which("epmd") or next(
        iter(sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))), None
    )
    if not os.path.exists(binary) or epmd_binary is None:
        pytest.skip("rabbitmq-server is not installed (scripts/setup.sh installs it)")
    port, dist, epmd_port = free_port(), free_port(), free_port()
    name = f"starling{port}@localhost"
    env = {
        **os.environ,
        "RABBITMQ_NODENAME": name,
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist),
        "ERL_EPMD_PORT": str(epmd_port),
        "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
        "RABBITMQ_LOG_BASE": str(folder / "log"),
        "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
        "RABBITMQ_PID_FILE": str(folder / "rabbit.pid"),
        "HOME": str(folder),  # the Erlang cookie goes here
    }
    (folder / "enabled_plugins").write_text("[].\n")
    (folder / "rabbitmq.conf").write_text(
        "loopback_users = none\ndefault_user = starling\ndefault_pass = rabbit-password\n"
    )
    # Our own epmd in the foreground on its own port, so the test owns it and stops it (the
    # node would otherwise start a daemon that outlives the test).
    epmd = subprocess.Popen(
        [str(epmd_binary), "-port", str(epmd_port), "-address", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(epmd_port, epmd, "epmd")
    proc = subprocess.Popen(
        [binary], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=folder
    )
    try:
        wait_port(port, proc, "rabbitmq-server", within_s=90)
    except BaseException:
        Rabbit("", proc, epmd).stop()
        raise
    return Rabbit(f"amqp://starling:rabbit-password@127.0.0.1:{port}/", proc, epmd)
