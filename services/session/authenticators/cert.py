"""Client certificates (mTLS): the connection node passes the identity of a certificate the
TLS handshake verified against `tls_ca_file`; the identity (CN or a SAN, setting
`cert_identity`) is `tenant/name` or `name`, read like an MQTT user name."""

from __future__ import annotations

from services.common.mqtt.reason import ReasonCode as RC
from services.session.auth import split_username
from services.session.verdict import IGNORE, Presented, Verdict, allow, deny

_SAN_PREFIX = {"san_dns": "DNS:", "san_email": "email:", "san_uri": "URI:"}


def cert_identity(source: str, common_name: str, alt_names: tuple[str, ...]) -> str:
    """The identity of a verified certificate ('' when it has none of that kind)."""
    if source == "cn":
        return common_name
    prefix = _SAN_PREFIX[source]
    return next((n.removeprefix(prefix) for n in alt_names if n.startswith(prefix)), "")


class CertAuthenticator:
    def __init__(self, source: str) -> None:
        self._source = source

    async def authenticate(self, p: Presented) -> Verdict:
        identity = cert_identity(self._source, p.cert_common_name, p.cert_subject_alt_names)
        if not identity:
            return IGNORE  # no certificate (or none with that field): not ours to decide
        try:
            tenant, name = split_username(identity)
        except ValueError:
            return deny("certificate identity names no valid tenant", RC.NOT_AUTHORIZED)
        if "/" not in identity:
            tenant = ""  # the presented tenant
        return allow(name, tenant)
