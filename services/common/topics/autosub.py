"""Auto-subscription filters (issue 17): a tenant's topic filters with `%c` (client id) and
`%u` (user name) placeholders that every client of the tenant is subscribed to at connect.

A placeholder's value is percent-escaped (`% + # / $` and NUL become `%25 %2B %23 %2F %24
%00`), so a client id such as `a/+` or `#` cannot add levels or wildcards to the filter, and
the result is the same topic level a rule's `${clientid}` template renders (a rule can
republish to `cmd/${clientid}` and an auto-subscription `cmd/%c` receive it). `%%` is a
literal `%`; any other `%x` is refused when the filter is added. A filter naming `%u` is
skipped for a client without a user name (an empty level would match other clients' topics).
Pure logic: the rules service validates with it, connection nodes render with it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.common.mqtt.errors import MqttError
from services.common.topics.rules import TopicLimits, validate_topic_filter
from services.common.topics.share import SHARE_PREFIX

_PLACEHOLDER = re.compile(r"%(.)", re.DOTALL)
_SPECIAL = re.compile("[%+#/$\x00]")


@dataclass(frozen=True, slots=True)
class AutoSubscription:
    filter: str  # the template, placeholders unrendered
    qos: int


def escape_level_value(value: str) -> str:
    """`value` as (part of) one topic level: wildcards, separators, `$`, NUL and `%` escaped."""
    if _SPECIAL.search(value) is None:
        return value
    return _SPECIAL.sub(lambda m: f"%{ord(m.group()):02X}", value)


def check_template(template: str, qos: int) -> None:
    """ValueError (naming what is wrong) unless `template` is a valid auto-subscription."""
    if not 0 <= qos <= 2:
        raise ValueError(f"qos: {qos} is not 0, 1 or 2")
    for m in _PLACEHOLDER.finditer(template.replace("%%", "")):
        if m.group(1) not in "cu":
            raise ValueError(f"filter: unknown placeholder %{m.group(1)} (%c, %u or %%)")
    if template.replace("%%", "").endswith("%"):
        raise ValueError("filter: a lone % at the end (write %% for a %)")
    if template.startswith(SHARE_PREFIX):
        raise ValueError("filter: a shared subscription cannot be an auto-subscription")
    if template.startswith("$"):
        raise ValueError("filter: a $ topic is the broker's own")
    try:
        validate_topic_filter(render(template, "c", "u") or "")
    except MqttError as exc:
        raise ValueError(f"filter: {exc}") from None


def render(template: str, client_id: str, username: str) -> str | None:
    """The filter for one client; None when it names `%u` and the client has no user name."""
    if "%" not in template:
        return template
    if "%u" in template.replace("%%", "") and not username:
        return None

    def value(m: re.Match[str]) -> str:
        c = m.group(1)
        if c == "c":
            return escape_level_value(client_id)
        if c == "u":
            return escape_level_value(username)
        return "%"  # %% (check_template refused anything else)

    return _PLACEHOLDER.sub(value, template)


def render_all(
    subs: tuple[AutoSubscription, ...], client_id: str, username: str, limits: TopicLimits
) -> list[tuple[str, int]]:
    """(filter, qos) of each auto-subscription that applies to this client: those whose
    rendered filter is valid within the node's limits (a long client id can exceed them)."""
    out: list[tuple[str, int]] = []
    for s in subs:
        f = render(s.filter, client_id, username)
        if f is None:
            continue
        try:
            validate_topic_filter(f, limits)
        except MqttError:
            continue
        out.append((f, s.qos))
    return out
