"""Log lines never carry a secret: URL passwords, bearer tokens, tenant admin tokens and the
process's registered secrets are masked in the finished JSON line, whatever path brought
them in (an extra field, an exception message)."""

from __future__ import annotations

import json
import logging

from services.common.admin_tokens import new_token
from services.common.logs import JsonFormatter
from services.common.redact import redact_url, register_secrets, scrub, url_passwords


def _line(msg: str, **extra: object) -> str:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, msg, (), None)
    for k, v in extra.items():
        setattr(record, k, v)
    return JsonFormatter("svc", "n1").format(record)


def test_urls_keep_user_and_host_but_lose_the_password() -> None:
    assert redact_url("nats://svc:p4ss@nats:4222") == "nats://svc:***@nats:4222"
    assert redact_url("redis://:p4ss@redis:6379/0") == "redis://:***@redis:6379/0"
    assert redact_url("redis://redis:6379/0") == "redis://redis:6379/0"
    assert url_passwords("a nats://u:one@h and redis://:two@h/0") == ["one", "two"]


def test_every_log_line_is_scrubbed() -> None:
    _, token = new_token()
    register_secrets(["registered-secret-value", "short"])
    line = _line(
        "connect to nats://svc:urlpass123@nats:4222 failed",
        header="authorization: Bearer operator-token-xyz",
        token=token,
        error=RuntimeError("boom registered-secret-value"),
    )
    for secret in ("urlpass123", "operator-token-xyz", token[17:], "registered-secret-value"):
        assert secret not in line
    out = json.loads(line)
    assert out["event"] == "connect to nats://svc:***@nats:4222 failed"
    assert out["token"] == f"{token[:17]}***"  # the id stays: it names the token
    # Too short to scrub by value without mangling ordinary words.
    assert scrub("a short word") == "a short word"
