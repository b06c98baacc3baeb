"""Hiding secrets in text: passwords inside URLs, bearer tokens, Starling admin tokens, and
the exact secret values a process registers (its settings' SecretStr fields).

The log formatter (services/common/logs.py) runs every finished line through `scrub`, so a
secret that reaches a log line by any path (an exception message, a URL in an error, a
header echoed by a library) is replaced by `***`.
"""

from __future__ import annotations

import re
import threading
from urllib.parse import urlsplit

MASK = "***"

# scheme://user:password@host -> keep the scheme, user and host.
_URL_USERINFO = re.compile(
    r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s\"']*):[^@/\s\"']*@"
)
_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]+")
# Tenant admin tokens (services/common/admin_tokens.py): `stk_<id>_<secret>`.
_ADMIN_TOKEN = re.compile(r"\bstk_([0-9a-f]+)_[0-9a-f]+")

_lock = threading.Lock()
_values: tuple[str, ...] = ()
# Shorter values are not scrubbed by value: they would mangle ordinary text (the patterns
# still catch them in URLs and headers).
_MIN_SECRET_LEN = 8


def redact_url(text: str) -> str:
    """`text` with the password of every URL in it replaced by ***."""
    return _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)


def url_passwords(text: str) -> list[str]:
    """Passwords found in URLs inside `text` (a settings value)."""
    out = []
    for m in re.finditer(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://\S+", text):
        try:
            password = urlsplit(m.group(0)).password
        except ValueError:
            continue
        if password:
            out.append(password)
    return out


def register_secrets(values: list[str]) -> None:
    """Scrub these exact values from every later log line of this process."""
    global _values
    with _lock:
        keep = {v for v in (*_values, *values) if len(v) >= _MIN_SECRET_LEN}
        # Longest first, so a secret that contains another is replaced whole.
        _values = tuple(sorted(keep, key=len, reverse=True))


def scrub(text: str) -> str:
    """`text` with URL passwords, bearer tokens, admin tokens and registered values hidden."""
    for value in _values:
        if value in text:
            text = text.replace(value, MASK)
    text = redact_url(text)
    text = _BEARER.sub(lambda m: f"{m[1]} {MASK}", text)
    return _ADMIN_TOKEN.sub(lambda m: f"stk_{m[1]}_{MASK}", text)
