"""Parsing of shared subscription filters `$share/{group}/{filter}` (spec 4.8.2)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.mqtt.errors import TopicFilterInvalidError
from services.common.topics.rules import DEFAULT_LIMITS, TopicLimits, validate_topic_filter

SHARE_PREFIX = "$share/"


@dataclass(frozen=True, slots=True)
class SharedFilter:
    group: str
    filter: str


def parse_shared(filt: str, limits: TopicLimits = DEFAULT_LIMITS) -> SharedFilter | None:
    """Return the group and inner filter of a shared filter, None for a plain filter."""
    if not filt.startswith(SHARE_PREFIX):
        return None
    if len(filt) > limits.max_length_bytes or len(filt.encode()) > limits.max_length_bytes:
        # The group name counts too: the whole filter is what the client makes us keep.
        raise TopicFilterInvalidError(
            "shared subscription filter too long", limit="max_topic_length_bytes"
        )
    rest = filt[len(SHARE_PREFIX) :]
    group, sep, inner = rest.partition("/")
    if not group or "+" in group or "#" in group:
        raise TopicFilterInvalidError("share name must be non-empty without wildcards")  # 4.8.2-1
    if not sep or not inner:
        raise TopicFilterInvalidError("shared subscription without a topic filter")  # 4.8.2-2
    validate_topic_filter(inner, limits)
    return SharedFilter(group, inner)
