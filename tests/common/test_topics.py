"""Topic rules, $share parsing, the trie against a naive matcher, and the subject mapping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.mqtt import MqttError, TopicFilterInvalidError, TopicNameInvalidError
from services.common.topics import (
    TopicLimits,
    TopicTrie,
    filter_to_subjects,
    parse_shared,
    subject_matches,
    subject_to_topic,
    topic_matches,
    topic_to_subject,
    validate_topic_filter,
    validate_topic_name,
)
from services.common.topics.trie import _NONE

LEVELS = ["a", "b", "$s", "", "x.y", "*", ">", "~", "é"]


@pytest.mark.parametrize("filt", ["a/#/b", "a#", "a/b+", "+a", "", "##"])
def test_invalid_filters_rejected_with_0x8f(filt: str) -> None:
    # [MQTT-4.7.1-1] [MQTT-4.7.1-2] [MQTT-4.7.3-1]
    with pytest.raises(TopicFilterInvalidError) as info:
        validate_topic_filter(filt)
    assert info.value.reason_code == 0x8F


@pytest.mark.parametrize("name", ["a/+", "a/#", "", "a+b"])
def test_invalid_topic_names_rejected_with_0x90(name: str) -> None:
    with pytest.raises(TopicNameInvalidError) as info:  # [MQTT-3.3.2-2] [MQTT-4.7.3-1]
        validate_topic_name(name)
    assert info.value.reason_code == 0x90


def test_limits_on_length_and_depth() -> None:
    limits = TopicLimits(max_length_bytes=8, max_levels=3)
    validate_topic_name("a/b/c", limits)
    with pytest.raises(TopicNameInvalidError):
        validate_topic_name("a/b/c/d", limits)
    with pytest.raises(TopicNameInvalidError):
        validate_topic_name("é" * 5, limits)  # 10 bytes of UTF-8
    with pytest.raises(TopicFilterInvalidError):
        validate_topic_filter("a/b/c/#", limits)


def test_shared_filter_parsing() -> None:
    s = parse_shared("$share/g1/a/+/c")
    assert s is not None and (s.group, s.filter) == ("g1", "a/+/c")
    assert parse_shared("a/b") is None
    for bad in ("$share/g", "$share//a", "$share/g+/a", "$share/g/"):
        with pytest.raises(MqttError):  # [MQTT-4.8.2-1] [MQTT-4.8.2-2]
            parse_shared(bad)


def test_dollar_topics_are_not_matched_by_leading_wildcards() -> None:
    # [MQTT-4.7.2-1]
    trie: TopicTrie[str, int] = TopicTrie()
    for f in ("#", "+/x", "$SYS/#", "$SYS/+"):
        trie.add(f, f, 0)
    assert sorted(k for k, _ in trie.match("$SYS/x")) == ["$SYS/#", "$SYS/+"]
    assert sorted(k for k, _ in trie.match("a/x")) == ["#", "+/x"]


def test_hash_matches_parent_level() -> None:
    trie: TopicTrie[str, int] = TopicTrie()
    trie.add("a/#", "k", 1)
    assert trie.match("a") == [("k", 1)]  # [MQTT-4.7.1-2]
    assert trie.match("ab") == []


def test_add_remove_count() -> None:
    trie: TopicTrie[str, int] = TopicTrie()
    assert trie.add("a/+", "c1", 1) and not trie.add("a/+", "c1", 2)
    assert trie.add("a/+", "c2", 1)
    assert len(trie) == 2 and trie.get("a/+", "c1") == 2
    assert trie.remove("a/+", "c1") and not trie.remove("a/+", "c1")
    assert trie.remove("a/+", "c2") and len(trie) == 0
    assert trie.match("a/b") == []


level = st.sampled_from(["a", "b", "$s", ""])
filter_level = st.sampled_from(["a", "b", "$s", "", "+"])


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(filter_level, min_size=1, max_size=4))
    if draw(st.booleans()):
        levels = [*levels[:-1], "#"] if draw(st.booleans()) else [*levels, "#"]
    return "/".join(levels) or "+"


topics = st.lists(level, min_size=1, max_size=5).map("/".join).filter(bool)


@settings(max_examples=300, deadline=None)
@given(fs=st.lists(filters(), max_size=25), ts=st.lists(topics, min_size=1, max_size=10))
def test_trie_agrees_with_naive_matcher(fs: list[str], ts: list[str]) -> None:
    trie: TopicTrie[int, str] = TopicTrie()
    for i, f in enumerate(fs):
        trie.add(f, i, f)
    for t in ts:
        expected = sorted(i for i, f in enumerate(fs) if topic_matches(f, t))
        assert sorted(k for k, _ in trie.match(t)) == expected, t


@settings(max_examples=200, deadline=None)
@given(
    fs=st.lists(st.tuples(filters(), st.integers(0, 3)), max_size=25),
    gone=st.lists(st.integers(0, 24), max_size=10),
    ts=st.lists(topics, min_size=1, max_size=8),
)
def test_trie_rebuilt_from_its_columns_matches_and_edits_alike(
    fs: list[tuple[str, int]], gone: list[int], ts: list[str]
) -> None:
    """A routing snapshot stores a trie as columns (services/router/snapshot.py); the trie
    loaded from them answers every topic alike, and both take later changes alike without
    ever writing into the empty dict that nodes share."""
    built: TopicTrie[int, str] = TopicTrie()
    for f, key in fs:
        built.add(f, key, f)
    levels, child_counts, sub_counts, members = built.columns()
    loaded: TopicTrie[int, str] = TopicTrie.from_columns(
        levels, child_counts, sub_counts, iter(members)
    )
    assert len(loaded) == len(built)
    for i in gone:  # the same removals and re-adds on both
        if i < len(fs):
            f, key = fs[i][0], fs[i][1]
            assert loaded.remove(f, key) == built.remove(f, key)
            assert loaded.add(f"{f}/n" if "#" not in f else "n", key + 9, f) == built.add(
                f"{f}/n" if "#" not in f else "n", key + 9, f
            )
    for t in ts:
        assert sorted(loaded.match(t)) == sorted(built.match(t)), t
    assert sorted(loaded.items()) == sorted(built.items())
    assert _NONE == {}


def test_trie_columns_that_do_not_add_up_are_refused() -> None:
    trie: TopicTrie[str, int] = TopicTrie()
    trie.add("a/b", "k", 1)
    levels, child_counts, sub_counts, members = trie.columns()
    with pytest.raises(ValueError):
        TopicTrie.from_columns(levels, [*child_counts[:-1], 1], sub_counts, iter(members))
    with pytest.raises(ValueError):
        TopicTrie.from_columns(levels, child_counts, sub_counts, iter([*members, ("x", 2)]))


mapping_level = st.one_of(
    st.sampled_from(LEVELS),
    st.text(max_size=4).filter(
        lambda s: "/" not in s and "+" not in s and "#" not in s and "\x00" not in s
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    levels=st.lists(mapping_level, min_size=1, max_size=4),
    tenant=st.sampled_from(["default", "t.1", "acme"]),
)
def test_subject_mapping_round_trips(levels: list[str], tenant: str) -> None:
    topic = "/".join(levels)
    if not topic:
        return
    subject = topic_to_subject(tenant, topic)
    assert subject_to_topic(subject) == (tenant, topic)
    assert " " not in subject and all(subject.split("."))


@settings(max_examples=400, deadline=None)
@given(f=filters(), t=topics)
def test_subject_mapping_preserves_matching(f: str, t: str) -> None:
    subjects = filter_to_subjects("ten", f)
    mapped = topic_to_subject("ten", t)
    assert topic_matches(f, t) == any(subject_matches(s, mapped) for s in subjects)


def test_hash_filter_maps_to_two_subjects() -> None:
    assert filter_to_subjects("t", "a/#") == ("mq.t.a", "mq.t.a.>")
    assert filter_to_subjects("t", "#") == ("mq.t.>",)
    assert filter_to_subjects("t", "$SYS/+") == ("mqd.t.~24SYS.*",)


def test_long_levels_hash_to_short_tokens_that_still_match() -> None:
    # A client picks level, group and client id lengths; NATS closes a connection for good
    # on a control line over its limit, so no subject may grow with them.
    from services.common.bus.subjects import shared_group
    from services.common.topics.subject import MAX_SUBJECT, MAX_TOKEN

    long_a, long_b = "é" * 1500, "é" * 1499 + "e"
    subject = topic_to_subject("ten", f"dev/{long_a}/temp")
    assert len(subject) < 200
    assert subject != topic_to_subject("ten", f"dev/{long_b}/temp")
    assert all(len(t) <= MAX_TOKEN for t in subject.split("."))
    assert any(subject_matches(s, subject) for s in filter_to_subjects("ten", f"dev/{long_a}/#"))
    assert any(subject_matches(s, subject) for s in filter_to_subjects("ten", "dev/+/temp"))
    assert not any(
        subject_matches(s, subject) for s in filter_to_subjects("ten", f"dev/{long_b}/#")
    )
    assert len(shared_group("ten", "g" * 30_000)) < 200
    # Escapes that grow past the token limit are hashed too (each '~' byte is 3 chars).
    assert len(topic_to_subject("ten", "é" * 40)) < MAX_SUBJECT
    with pytest.raises(TopicNameInvalidError):
        subject_to_topic(subject)


def test_subject_over_the_bus_limit_is_refused() -> None:
    deep = TopicLimits(max_length_bytes=65535, max_levels=1024)
    many = "/".join(["abcdefgh" * 8] * 60)
    with pytest.raises(TopicFilterInvalidError):
        filter_to_subjects("ten", many, deep)
