"""The node settings of MQTT 5 features: a bad value stops start-up naming the setting."""

from __future__ import annotations

import pytest

from services.common.config import ConfigError, load_settings
from services.connection.config import ConnectionSettings
from services.connection.main import channel_config


@pytest.mark.parametrize("template", ["a/#/{client_id}", "$SYS/{client_id}", "x/+"])
def test_unusable_response_information_is_refused(template: str) -> None:
    with pytest.raises(ConfigError, match="response_information"):
        load_settings(ConnectionSettings, response_information=template)


def test_empty_server_reference_is_refused() -> None:
    with pytest.raises(ConfigError, match="redirects"):
        load_settings(ConnectionSettings, redirects={"acme": {"server_reference": ""}})


# The mesh secrets are not what this test is about.
_NO_AUTH = {"admin_auth": "disabled", "mesh_auth": "disabled"}


def test_settings_reach_the_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "STARLING_REDIRECTS", '{"acme": {"server_reference": "b:1883", "moved": true}}'
    )
    monkeypatch.setenv("STARLING_REASON_STRINGS", "false")
    cfg = channel_config(load_settings(ConnectionSettings, response_information="", **_NO_AUTH))
    assert cfg.redirects == {"acme": ("b:1883", True)}
    assert not cfg.reason_strings and cfg.response_information == ""
    monkeypatch.delenv("STARLING_REDIRECTS")
    monkeypatch.delenv("STARLING_REASON_STRINGS")
    default = channel_config(load_settings(ConnectionSettings, **_NO_AUTH))
    assert default.reason_strings and default.response_information == "$response/{client_id}"
