"""Write docs/configuration.md from the settings models (`python -m scripts.gen_config_docs`).

tests/test_docs.py fails when the committed file differs from what this produces.
"""

from __future__ import annotations

from pathlib import Path

from pydantic.fields import FieldInfo

from analytics.config import AnalyticsSettings
from services.common.config import ServiceSettings
from services.connection.config import ConnectionSettings
from services.console.config import ConsoleSettings
from services.gateway.config import GatewaySettings
from services.metrics.config import MetricsSettings
from services.queue.config import QueueSettings
from services.quota.config import QuotaSettings
from services.router.config import RouterSettings
from services.rules.config import RulesSettings
from services.session.config import SessionSettings

ROOT = Path(__file__).resolve().parent.parent
MODELS: list[type[ServiceSettings]] = [
    ConnectionSettings,
    SessionSettings,
    RouterSettings,
    QueueSettings,
    RulesSettings,
    QuotaSettings,
    MetricsSettings,
    ConsoleSettings,
    GatewaySettings,
    AnalyticsSettings,
]


# Profiles and the refusals they decide (services/cli/profiles.py keeps the list).
PROFILES_NOTE = [
    "The defaults below are production's. The local mesh (`starling up`, `make run`) runs",
    "the `development` profile unless told `--profile production`: `max_connections_per_ip`",
    "0, `flapping_enabled` false, `auth_failures_before_backoff_ip` 1000000 (every client of",
    "one machine comes from 127.0.0.1); a `STARLING_*` variable you set wins over the",
    "profile. A refusal by either protection names its setting: the 1,001st connection from",
    "one address to a node gets CONNACK 0x97 with a Reason String naming",
    "`max_connections_per_ip` (log event `connections_per_ip_refused`), and a flapping",
    "client CONNACK 0x8A with one",
    "naming `flapping_max_connects` (or `flapping_max_connects_per_address`),",
    "`flapping_window_s`, `flapping_ban_s` and `flapping_enabled` (log event",
    "`client_flapping`, the same fields). The gateway's per-address request rates",
    "(`gateway_requests_per_ip_per_s`, `gateway_coap_messages_per_ip_per_s`) are 0 (no cap)",
    "there too.",
]


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    else:
        value = info.default
    if hasattr(value, "get_secret_value"):
        value = "" if not value.get_secret_value() else "***"
    return f"`{value!r}`" if value not in (None, "") else "`" + repr(value) + "`"


def _constraints(info: FieldInfo) -> str:
    parts = []
    for m in info.metadata:
        for key in ("ge", "gt", "le", "lt", "pattern"):
            if getattr(m, key, None) is not None:
                parts.append(f"{key} {getattr(m, key)}")
    return ", ".join(parts)


def _table(fields: dict[str, FieldInfo]) -> list[str]:
    rows = ["| setting | env | default | constraints | meaning |", "|---|---|---|---|---|"]
    for name, info in fields.items():
        cells = [
            f"`{name}`",
            f"`STARLING_{name.upper()}`",
            _default(info),
            _constraints(info),
            info.description or "",
        ]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return rows


def render() -> str:
    common = ServiceSettings.model_fields
    lines = [
        "# Configuration reference",
        "",
        "Generated from the settings models by `python -m scripts.gen_config_docs`; a test keeps",
        "it in sync. Every service reads environment variables `STARLING_<SETTING>` and, if",
        "`STARLING_CONFIG` names a TOML file, its `[common]` table and then the table named after",
        "the service (`[connection]`, `[session]`, ...). Environment beats the file. A bad value",
        "stops the service at start with exit code 2 and a message naming the setting, e.g.",
        "`starling connection: invalid setting grpc_port (STARLING_GRPC_PORT): ...`; so does",
        "a key in the service's own table that is no setting of it (a typo); `[common]` may",
        "hold any service's settings. A rule between settings names them and never prints",
        "values; list and mapping settings take JSON (`STARLING_ANONYMOUS_TENANTS='[\"a\"]'`).",
        "If `STARLING_SECRETS_DIR` names a folder, a file `starling_<setting>` in it sets that",
        "setting (Docker and Kubernetes secrets: `starling_admin_token`, `starling_mesh_secret`,",
        '...); the environment beats it, it beats the TOML file. With `admin_auth = "token"`',
        '(the default) a service without `admin_token`, and with `mesh_auth = "secret"` one',
        "without `mesh_secret`, stops at start naming the setting.",
        "",
        *PROFILES_NOTE,
        "",
        "```toml",
        "[common]",
        'nats_url = "nats://nats:4222"',
        "# admin_token, mesh_secret and passwords: from STARLING_* variables or secret",
        "# files (STARLING_SECRETS_DIR), never from a file under version control",
        "",
        "[connection]",
        "mqtt_port = 1883",
        "ws_port = 8083",
        "",
        "[session]",
        'anonymous_tenants = ["public"]',
        "```",
        "",
        "## Common to every service",
        "",
        *_table(dict(common)),
    ]
    for model in MODELS:
        own = {
            k: v
            for k, v in model.model_fields.items()
            if k not in common or v.default != common[k].default
        }
        lines += ["", f"## {model.service_name}", ""]
        lines += _table(own) if own else ["No settings beyond the common ones."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    (ROOT / "docs" / "configuration.md").write_text(render())
    print("wrote docs/configuration.md")
