"""Settings: env and TOML sources, and start-up failures that name the bad setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.config import ConfigError, load_settings
from services.connection.config import ConnectionSettings
from services.session.config import SessionSettings


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start-up refuses to run without its secrets; these tests are about other settings."""
    monkeypatch.setenv("STARLING_ADMIN_TOKEN", "operator-token")
    monkeypatch.setenv("STARLING_MESH_SECRET", "mesh-secret-value")


def test_env_and_toml_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "starling.toml"
    cfg.write_text(
        '[common]\nlog_level = "DEBUG"\ngrpc_port = 7100\n[session]\nanonymous_tenants = ["open"]\n'
    )
    monkeypatch.setenv("STARLING_CONFIG", str(cfg))
    monkeypatch.setenv("STARLING_GRPC_PORT", "7200")  # env beats the file
    s = load_settings(SessionSettings)
    assert (s.log_level, s.grpc_port, s.anonymous_tenants) == ("DEBUG", 7200, ["open"])


def test_bad_value_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STARLING_RECEIVE_MAXIMUM", "0")
    with pytest.raises(ConfigError, match=r"receive_maximum.*STARLING_RECEIVE_MAXIMUM"):
        load_settings(ConnectionSettings)


def test_tls_port_without_certificate_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STARLING_TLS_PORT", "8883")
    with pytest.raises(ConfigError, match="tls_cert_file"):
        load_settings(ConnectionSettings)


def test_secrets_are_redacted_in_the_effective_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STARLING_ADMIN_TOKEN", "hunter2")
    s = load_settings(SessionSettings)
    assert s.admin_token.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(s.redacted())


def test_url_passwords_are_redacted_in_the_effective_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STARLING_NATS_URL", "nats://svc:n4ts-pass@nats:4222")
    monkeypatch.setenv("STARLING_REDIS_URL", "redis://:r3dis-pass@redis:6379/0")
    monkeypatch.setenv("STARLING_NATS_PASSWORD", "separate-nats-pw")
    s = load_settings(SessionSettings)
    shown = repr(s.redacted())
    for secret in ("n4ts-pass", "r3dis-pass", "separate-nats-pw", "operator-token"):
        assert secret not in shown
    assert s.redacted()["nats_url"] == "nats://svc:***@nats:4222"
    assert {"n4ts-pass", "r3dis-pass", "separate-nats-pw"} <= set(s.secret_values())


def test_secrets_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Docker/Kubernetes secrets: one file per setting in STARLING_SECRETS_DIR; env wins."""
    monkeypatch.delenv("STARLING_ADMIN_TOKEN")
    (tmp_path / "starling_admin_token").write_text("from-a-file\n")
    (tmp_path / "starling_nats_password").write_text("nats-from-a-file")
    monkeypatch.setenv("STARLING_SECRETS_DIR", str(tmp_path))
    s = load_settings(SessionSettings)
    assert s.admin_token.get_secret_value() == "from-a-file"
    assert s.nats_password.get_secret_value() == "nats-from-a-file"
    assert s.mesh_secret.get_secret_value() == "mesh-secret-value"  # the environment's


@pytest.mark.parametrize(
    ("unset", "setting", "off"),
    [
        ("STARLING_ADMIN_TOKEN", "admin_token", ("STARLING_ADMIN_AUTH", "disabled")),
        ("STARLING_MESH_SECRET", "mesh_secret", ("STARLING_MESH_AUTH", "disabled")),
    ],
)
def test_a_missing_secret_stops_start_up_naming_it(
    monkeypatch: pytest.MonkeyPatch, unset: str, setting: str, off: tuple[str, str]
) -> None:
    monkeypatch.delenv(unset)
    with pytest.raises(ConfigError, match=rf"invalid setting {setting} \({unset}\): required"):
        load_settings(SessionSettings)
    monkeypatch.setenv(*off)  # explicitly off: a local mesh may run without it
    load_settings(SessionSettings)


def test_service_process_without_admin_token_exits_2() -> None:
    env = {**os.environ, "STARLING_MESH_SECRET": "m"}
    env.pop("STARLING_ADMIN_TOKEN", None)
    proc = subprocess.run(
        [sys.executable, "-m", "services.metrics"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "admin_token" in proc.stderr and "STARLING_ADMIN_TOKEN" in proc.stderr


@pytest.mark.parametrize("service", ["session", "connection", "metrics"])
def test_service_process_exits_2_naming_the_setting(service: str) -> None:
    env = {**os.environ, "STARLING_GRPC_PORT": "not-a-port"}
    proc = subprocess.run(
        [sys.executable, "-m", f"services.{service}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "grpc_port" in proc.stderr and "STARLING_GRPC_PORT" in proc.stderr


def test_reuse_port_with_a_port_picked_by_the_kernel_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Port 0 would give every worker a port of its own: nothing would be shared."""
    monkeypatch.setenv("STARLING_REUSE_PORT", "true")
    monkeypatch.setenv("STARLING_MQTT_PORT", "0")
    with pytest.raises(ConfigError, match=r"reuse_port.*mqtt_port"):
        load_settings(ConnectionSettings)
    monkeypatch.setenv("STARLING_MQTT_PORT", "18830")
    assert load_settings(ConnectionSettings).reuse_port


def test_a_tenant_trace_share_outside_0_to_1_stops_start_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STARLING_TRACE_SAMPLE_TENANTS", '{"acme": 1.5, "ok": 0.5}')
    with pytest.raises(ConfigError, match=r"trace_sample_tenants.*acme"):
        load_settings(ConnectionSettings)


def test_a_rule_between_settings_names_them_and_shows_no_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its error's input is every setting at once: the message used to print them all,
    # admin token, mesh secret and passwords in clear.
    monkeypatch.setenv("STARLING_TLS_PORT", "0")
    monkeypatch.setenv("STARLING_REDIS_URL", "redis://:r3dis-pass@redis:6379/0")
    with pytest.raises(ConfigError) as info:
        load_settings(ConnectionSettings)
    text = str(info.value)
    assert "tls_port" in text and "tls_cert_file" in text
    for secret in ("operator-token", "mesh-secret-value", "r3dis-pass"):
        assert secret not in text


def test_a_list_setting_given_a_plain_value_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STARLING_ANONYMOUS_TENANTS", "acme")  # wants ["acme"]
    with pytest.raises(ConfigError, match=r"anonymous_tenants \(STARLING_ANONYMOUS_TENANTS\)"):
        load_settings(SessionSettings)


def test_a_missing_certificate_file_stops_start_up_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STARLING_TLS_CERT_FILE", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match=r"tls_cert_file .*no such file"):
        load_settings(ConnectionSettings)
    monkeypatch.setenv("STARLING_JWT_PUBLIC_KEY_FILE", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match=r"jwt_public_key_file .*no such file"):
        load_settings(SessionSettings)


def test_a_typo_in_a_services_toml_section_stops_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "starling.toml"
    # `common` may hold other services' settings; a service's own section may not.
    cfg.write_text('[common]\nmax_queue_depth = 5\n[session]\nacl_defualt = "deny"\n')
    monkeypatch.setenv("STARLING_CONFIG", str(cfg))
    with pytest.raises(ConfigError, match=r"\[session\] has no setting 'acl_defualt'"):
        load_settings(SessionSettings)
    cfg.write_text('[common]\nmax_queue_depth = 5\n[session]\nacl_default = "deny"\n')
    load_settings(SessionSettings)


def test_a_control_packet_burst_below_the_subscription_limit_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A client subscribing one filter per SUBSCRIBE would be cut off at every connect.
    monkeypatch.setenv("STARLING_MAX_SUBSCRIPTIONS_PER_CLIENT", "5000")
    with pytest.raises(ConfigError, match="control_packets_burst"):
        load_settings(ConnectionSettings)
    monkeypatch.setenv("STARLING_CONTROL_PACKETS_BURST", "5000")
    load_settings(ConnectionSettings)


def test_an_empty_file_setting_is_no_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STARLING_TLS_CA_FILE", "")
    assert load_settings(ConnectionSettings).tls_ca_file is None
