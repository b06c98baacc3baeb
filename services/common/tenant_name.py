"""What a tenant name may be: 1-64 of [A-Za-z0-9_-]. Tenant names become parts of NATS
subjects, Redis keys and store keys, and of user names (`tenant/user`); every place that takes
one from outside checks it here (the session service's logins and tokens, every admin API)."""

from __future__ import annotations

import re

TENANT_NAME = re.compile(r"[A-Za-z0-9_\-]{1,64}")  # use with fullmatch: `$` allows a "\n"


def check_tenant(tenant: str) -> None:
    """Raise ValueError naming `tenant` (cut to 80 characters) if it is not a tenant name."""
    if not TENANT_NAME.fullmatch(tenant):
        raise ValueError(f"invalid tenant name {tenant[:80]!r}: 1-64 of [A-Za-z0-9_-]")
