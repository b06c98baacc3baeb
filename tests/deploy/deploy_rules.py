"""What the deploy files are held to (tests/deploy/test_deploy_*.py): the settings model of
each service, the services that share Redis or run several instances, and the checks of an
environment and of a NATS route configuration that compose and Kubernetes have in common."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from pydantic import SecretStr

from services.common.config import ENV_PREFIX, ServiceSettings
from services.connection.config import ConnectionSettings
from services.console.config import ConsoleSettings
from services.gateway.config import GatewaySettings
from services.metrics.config import MetricsSettings
from services.queue.config import QueueSettings
from services.quota.config import QuotaSettings
from services.router.config import RouterSettings
from services.rules.config import RulesSettings
from services.session.config import SessionSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "docker-compose.yml"
K8S = ROOT / "deploy" / "k8s" / "starling.yaml"
K8S_JOBS = ROOT / "deploy" / "k8s" / "analytics-cronjob.yaml"
SETTINGS: dict[str, type[ServiceSettings]] = {
    "connection": ConnectionSettings,
    "session": SessionSettings,
    "router": RouterSettings,
    "queue": QueueSettings,
    "rules": RulesSettings,
    "quota": QuotaSettings,
    "metrics": MetricsSettings,
    "console": ConsoleSettings,
    "gateway": GatewaySettings,
}
# Read by the settings loader itself, not fields.
SOURCE_VARIABLES = {"STARLING_SECRETS_DIR", "STARLING_CONFIG"}
# Services that talk to Redis (and so need its password); a router and the metrics service
# only among several (their shared state).
REDIS_USERS = {"session", "quota", "queue", "console"}
SHARING = {"router", "metrics"}
# One instance each, the reason said in the files' headers (none left: issue 18).
SINGLE: set[str] = set()
# Everything else runs at least this many.
SCALED = 2
GRPC_PORTS = {name: cls.model_fields["grpc_port"].default for name, cls in SETTINGS.items()}
SECRET_TARGET = re.compile(r"^starling_[a-z_]+$")


def secret_fields(cls: type[ServiceSettings]) -> set[str]:
    return {n for n, f in cls.model_fields.items() if f.annotation is SecretStr}


def check_env(service: str, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every STARLING_ variable is a setting of `service`, and the settings load with them."""
    cls = SETTINGS[service]
    fields = set(cls.model_fields)
    for name in env:
        assert name.startswith(ENV_PREFIX), f"{service}: {name} is not a STARLING_ variable"
        if name in SOURCE_VARIABLES:
            continue
        field = name.removeprefix(ENV_PREFIX).lower()
        assert field in fields, f"{service}: {name} is not a setting of {cls.__name__}"
        assert field not in secret_fields(cls), f"{service}: credential {name} in plain env"
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if name not in SOURCE_VARIABLES:
            monkeypatch.setenv(name, str(value))
    # Credentials come from files at run time: stand-ins here so the check can pass.
    monkeypatch.setenv("STARLING_ADMIN_TOKEN", "x")
    monkeypatch.setenv("STARLING_MESH_SECRET", "x")
    settings = cls()  # a bad value raises, naming the setting
    assert settings.metrics_host == "0.0.0.0", f"{service}: metrics not reachable from outside"


def nats_conf_routes(conf: str) -> tuple[str, list[tuple[str, str]]]:
    """The route password the cluster port asks for, and (password, host) of each route."""
    asked = re.search(r'authorization \{ user: "route", password: "([0-9a-f]+)" \}', conf)
    assert asked, "the cluster port asks for no password"
    routes = re.findall(r'"nats-route://route:([0-9a-f]+)@([^:"]+):6222"', conf)
    return asked.group(1), routes
