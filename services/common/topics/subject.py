"""Reversible mapping between MQTT topics/filters and NATS subjects (DESIGN.md).

- Topic `a/b` of tenant `t` becomes `mq.t.a.b`; topics whose first level starts with `$` use
  the prefix `mqd` so that filters starting with `+` or `#` never reach them [MQTT-4.7.2-1].
- Each level (and the tenant) is escaped: bytes outside `[A-Za-z0-9_-]` become `~XX` (hex of
  the UTF-8 byte), and an empty level becomes the single token `~`. The escape is injective,
  so `subject_to_topic` inverts it exactly, except for long tokens below.
- A token whose escape is longer than `MAX_TOKEN` becomes `~~` and a 128-bit digest of the
  level (the escape never produces `~~`, so hashed and escaped tokens cannot collide). NATS
  closes a connection for good on a control line over its limit (4 KiB by default), so a
  client-chosen level, group name or client id must never make a subject long; with hashing
  a subject is at most about `MAX_TOKEN` bytes per level, and `check_subject` refuses what is
  still over `MAX_SUBJECT` (only possible with topic-level limits raised far beyond default).
- In filters `+` becomes `*`; `a/#` becomes two subjects, `a` and `a.>` ([MQTT-4.7.1-2]:
  `#` also matches the parent level); `#` alone becomes `>`.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

from services.common.mqtt.errors import TopicFilterInvalidError, TopicNameInvalidError
from services.common.topics.rules import (
    DEFAULT_LIMITS,
    TopicLimits,
    validate_topic_filter,
    validate_topic_name,
)

NORMAL_PREFIX = "mq"
DOLLAR_PREFIX = "mqd"
_SAFE = re.compile(r"[A-Za-z0-9_\-]+")
MAX_TOKEN = 64
MAX_SUBJECT = 3072
HASHED = "~~"


def escape_token(level: str) -> str:
    """One subject token for one level (or tenant, group, id), at most `MAX_TOKEN` long."""
    if not level:
        return "~"
    if len(level) <= MAX_TOKEN and _SAFE.fullmatch(level):
        return level
    out = []
    for ch in level:
        if ch.isascii() and (ch.isalnum() or ch in "_-"):
            out.append(ch)
        else:
            out.extend(f"~{b:02X}" for b in ch.encode())
    token = "".join(out)
    if len(token) > MAX_TOKEN:
        return HASHED + hashlib.blake2b(level.encode(), digest_size=16).hexdigest()
    return token


def unescape_token(token: str) -> str:
    if token.startswith(HASHED):
        raise TopicNameInvalidError("a hashed subject token cannot be reversed")
    if token == "~":
        return ""
    if "~" not in token:
        return token
    raw = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "~":
            raw += bytes.fromhex(token[i + 1 : i + 3])
            i += 3
        else:
            raw += token[i].encode()
            i += 1
    return raw.decode()


@lru_cache(maxsize=65536)
def topic_to_subject(tenant: str, topic: str) -> str:
    """Subject a PUBLISH on `topic` goes out on. Raises `TopicNameInvalidError` (0x90)."""
    validate_topic_name(topic, DEFAULT_LIMITS)
    prefix = DOLLAR_PREFIX if topic[0] == "$" else NORMAL_PREFIX
    subject = ".".join((prefix, escape_token(tenant), *map(escape_token, topic.split("/"))))
    if len(subject) > MAX_SUBJECT:
        raise TopicNameInvalidError("topic name maps to a subject longer than the bus allows")
    return subject


def subject_to_topic(subject: str) -> tuple[str, str]:
    """Inverse of `topic_to_subject`: (tenant, topic)."""
    tokens = subject.split(".")
    if len(tokens) < 3 or tokens[0] not in (NORMAL_PREFIX, DOLLAR_PREFIX):
        raise TopicNameInvalidError(f"not a Starling topic subject: {subject!r}")
    return unescape_token(tokens[1]), "/".join(map(unescape_token, tokens[2:]))


def filter_to_subjects(
    tenant: str, filt: str, limits: TopicLimits = DEFAULT_LIMITS
) -> tuple[str, ...]:
    """NATS subscription subjects that together receive exactly the topics `filt` matches."""
    validate_topic_filter(filt, limits)
    levels = filt.split("/")
    prefix = DOLLAR_PREFIX if levels[0][:1] == "$" else NORMAL_PREFIX
    head = [prefix, escape_token(tenant)]
    tokens: list[str] = []
    for level in levels:
        if level == "+":
            tokens.append("*")
        elif level == "#":
            if not tokens:
                return (".".join([*head, ">"]),)
            parent = ".".join(head + tokens)
            if len(parent) + 2 > MAX_SUBJECT:
                raise TopicFilterInvalidError(
                    "topic filter maps to a subject longer than the bus allows"
                )
            return (parent, parent + ".>")
        else:
            tokens.append(escape_token(level))
    subject = ".".join(head + tokens)
    if len(subject) + 2 > MAX_SUBJECT:
        raise TopicFilterInvalidError("topic filter maps to a subject longer than the bus allows")
    return (subject,)


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS matching semantics (`*` one token, `>` one or more trailing tokens)."""
    p = pattern.split(".")
    s = subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)
