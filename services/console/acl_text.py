"""The ACL as the console edits it: one rule per line, in order,

    allow|deny publish|subscribe|all TOPIC_FILTER [user=NAME] [client=ID]

(`#` starts a comment line). Pure: text in, `AclRule`s out, and back. The session service
validates the filters when the ACL is set (its error names rules[i])."""

from __future__ import annotations

from collections.abc import Sequence

from services.common.acl import Access, AclRule

_ACCESS = {"publish": Access.PUBLISH, "subscribe": Access.SUBSCRIBE, "all": Access.ALL}
_PERMISSION = {"allow": True, "deny": False}


class AclTextError(ValueError):
    """A line that is not a rule; the message names the line."""


def parse_rules(text: str) -> list[AclRule]:
    rules = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        rules.append(_rule(line, number))
    return rules


def _rule(line: str, number: int) -> AclRule:
    words = line.split()
    if len(words) < 3 or words[0] not in _PERMISSION or words[1] not in _ACCESS:
        raise AclTextError(
            f"line {number}: expected 'allow|deny publish|subscribe|all FILTER "
            f"[user=NAME] [client=ID]', got {line!r}"
        )
    extra: dict[str, str] = {}
    for word in words[3:]:
        key, sep, value = word.partition("=")
        if not sep or key not in ("user", "client") or not value or key in extra:
            raise AclTextError(f"line {number}: unexpected {word!r} (user=NAME or client=ID)")
        extra[key] = value
    return AclRule(
        allow=_PERMISSION[words[0]],
        access=_ACCESS[words[1]],
        topic_filter=words[2],
        username=extra.get("user", ""),
        client_id=extra.get("client", ""),
    )


def format_rules(rules: Sequence[AclRule]) -> str:
    lines = []
    for r in rules:
        words = ["allow" if r.allow else "deny", r.access.name.lower(), r.topic_filter]
        if r.username:
            words.append(f"user={r.username}")
        if r.client_id:
            words.append(f"client={r.client_id}")
        lines.append(" ".join(words))
    return "\n".join(lines)
