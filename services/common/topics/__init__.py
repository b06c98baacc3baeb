"""Topic tools: name/filter rules, `$share` parsing, the subscription trie, subject mapping."""

from services.common.topics.rules import (
    DEFAULT_LIMITS,
    NO_LIMITS,
    TopicLimits,
    is_sys_topic,
    is_wildcard,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)
from services.common.topics.share import SharedFilter, parse_shared
from services.common.topics.subject import (
    filter_to_subjects,
    subject_matches,
    subject_to_topic,
    topic_to_subject,
)
from services.common.topics.trie import TopicTrie

__all__ = [
    "DEFAULT_LIMITS",
    "NO_LIMITS",
    "SharedFilter",
    "TopicLimits",
    "TopicTrie",
    "filter_to_subjects",
    "is_sys_topic",
    "is_wildcard",
    "parse_shared",
    "subject_matches",
    "subject_to_topic",
    "topic_matches",
    "topic_to_subject",
    "validate_topic_filter",
    "validate_topic_name",
]
