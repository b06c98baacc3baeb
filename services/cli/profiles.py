"""Settings profiles of the local mesh (`starling up --profile NAME`).

`development` (the default of `starling up` and of the test fixtures' launcher) is for one
machine where every client comes from 127.0.0.1: test suites and benchmarks of thousands of
clients, conformance suites that reconnect one client id over and over. It turns off what
refuses such traffic by address or by reconnect count:

- `max_connections_per_ip` 0 (no cap; production: 1,000 per node and address),
- `flapping_enabled` false (production: a client id that connects more than 15 times a
  minute from one address is banned for 5 minutes),
- `auth_failures_before_backoff_ip` 1,000,000 (production: after 20 failed logins from one
  address every login from it waits out a back-off; a suite testing bad passwords would
  lock its own good logins out). The per-user back-off stays.
- the gateway's per-address request rates 0 (no cap; production: 1,000 HTTP requests and 100
  CoAP requests a second per address).

It also lets anonymous clients into every tenant (`anonymous_by_default`). `production` is
the services' code defaults, every protection on: what a deployment runs, shown locally.

The services' own defaults stay production-safe: `starling serve X` and the deploy files
never see a profile. A STARLING_* variable in the caller's environment wins over the
profile's value (and a launcher's `extra_env` over both).
"""

from __future__ import annotations

from collections.abc import Mapping

DEVELOPMENT = "development"
PRODUCTION = "production"
PROFILES = (DEVELOPMENT, PRODUCTION)

_SETTINGS: dict[str, dict[str, str]] = {
    DEVELOPMENT: {
        "STARLING_MAX_CONNECTIONS_PER_IP": "0",
        "STARLING_FLAPPING_ENABLED": "false",
        "STARLING_AUTH_FAILURES_BEFORE_BACKOFF_IP": "1000000",
        "STARLING_GATEWAY_REQUESTS_PER_IP_PER_S": "0",
        "STARLING_GATEWAY_COAP_MESSAGES_PER_IP_PER_S": "0",
    },
    PRODUCTION: {},
}


def check_profile(name: str) -> str:
    """`name` if it is a profile; ValueError naming the choices otherwise."""
    if name not in _SETTINGS:
        raise ValueError(f"profile (--profile) must be one of {', '.join(PROFILES)}, not {name!r}")
    return name


def profile_settings(name: str, caller_env: Mapping[str, str]) -> dict[str, str]:
    """The variables profile `name` sets for the children: its values, except those the
    caller's environment names itself."""
    return {k: v for k, v in _SETTINGS[check_profile(name)].items() if k not in caller_env}


def anonymous_by_default(name: str) -> bool:
    """Whether the launcher lets anonymous clients into every tenant unless told."""
    return check_profile(name) == DEVELOPMENT


def describe(name: str) -> str:
    """One line for `starling up` and `starling status`."""
    if name == DEVELOPMENT:
        return (
            "profile development: no per-IP cap, no flapping bans, anonymous clients "
            "(--profile production keeps every protection)"
        )
    if name == PRODUCTION:
        return (
            "profile production: the services' defaults (max_connections_per_ip 1000, "
            "flapping bans on, no anonymous clients: add users with `starling user-add`)"
        )
    return "profile unknown (a mesh started before profiles)"
