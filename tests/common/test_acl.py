"""ACL evaluation: substitution, first match wins, subscribe coverage and overlap."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.acl import (
    Access,
    AclChecker,
    AclRule,
    filter_covers,
    filters_overlap,
    substitute,
)
from services.common.topics import topic_matches

LEVELS = ["a", "b", ""]


def test_substitution_and_selectors() -> None:
    rules = [
        AclRule(True, Access.PUBLISH, "dev/%c/%u"),
        AclRule(False, Access.ALL, "#", username="eve"),
    ]
    out = substitute(rules, "bob", "c7")
    assert out == [AclRule(True, Access.PUBLISH, "dev/c7/bob")]
    assert len(substitute(rules, "eve", "c1")) == 2


def test_first_match_wins_and_default() -> None:
    chk = AclChecker(
        [AclRule(True, Access.PUBLISH, "a/ok"), AclRule(False, Access.PUBLISH, "a/#")],
        default_allow=True,
    )
    assert chk.can_publish("a/ok") and not chk.can_publish("a/no")
    assert chk.can_publish("b")  # default
    assert not AclChecker([], default_allow=False).can_publish("x")


def test_subscribe_needs_coverage_for_allow_and_overlap_for_deny() -> None:
    chk = AclChecker(
        [
            AclRule(False, Access.SUBSCRIBE, "secret/#"),
            AclRule(True, Access.SUBSCRIBE, "sensors/#"),
        ],
        default_allow=False,
    )
    assert chk.can_subscribe("sensors/+/temp")
    assert not chk.can_subscribe("#")  # overlaps the deny rule
    assert not chk.can_subscribe("other/x")  # default deny


all_levels = st.sampled_from(["a", "b", "", "+"])
topics = st.lists(st.sampled_from(LEVELS), min_size=1, max_size=4).map("/".join)


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(all_levels, min_size=1, max_size=3))
    if draw(st.booleans()):
        levels.append("#")
    return "/".join(levels)


ALL_TOPICS = [
    "/".join(p) for n in range(1, 6) for p in __import__("itertools").product(LEVELS, repeat=n)
]


@settings(max_examples=300, deadline=None)
@given(rule=filters(), req=filters())
def test_cover_and_overlap_agree_with_brute_force(rule: str, req: str) -> None:
    matched_req = [t for t in ALL_TOPICS if topic_matches(req, t)]
    covers = all(topic_matches(rule, t) for t in matched_req)
    overlap = any(topic_matches(rule, t) for t in matched_req)
    # Topics of up to five levels over the filters' own literals are an exhaustive witness
    # set for filters of at most four levels.
    assert filter_covers(rule, req) == covers
    assert filters_overlap(rule, req) == overlap


@pytest.mark.parametrize("client_id", ["#", "+", "a/b", "x/#", ""])
def test_template_values_with_wildcards_or_separators_do_not_widen_an_allow_rule(
    client_id: str,
) -> None:
    rules = [AclRule(True, Access.ALL, "devices/%c/#")]
    acl = AclChecker(substitute(rules, "user", client_id), default_allow=False)
    assert not acl.can_subscribe("devices/#")
    assert not acl.can_subscribe("devices/+/state")
    assert not acl.can_subscribe("devices/a/#")
    assert not acl.can_publish("devices/a/b/state")
    assert not acl.can_publish("devices/other/state")


def test_a_plain_client_id_keeps_its_own_subtree() -> None:
    rules = [AclRule(True, Access.ALL, "devices/%c/#"), AclRule(True, Access.ALL, "users/%u")]
    acl = AclChecker(substitute(rules, "bob", "dev-1"), default_allow=False)
    assert acl.can_subscribe("devices/dev-1/#") and acl.can_publish("devices/dev-1/t")
    assert acl.can_publish("users/bob")
    assert not acl.can_subscribe("devices/dev-2/#")


def test_a_deny_rule_with_a_wildcard_value_only_refuses_more() -> None:
    rules = [AclRule(False, Access.PUBLISH, "jail/%c/#")]
    acl = AclChecker(substitute(rules, "u", "+"), default_allow=True)
    assert not acl.can_publish("jail/anyone/x")
    assert acl.can_publish("free/x")


def test_delayed_publish_is_checked_on_its_effective_topic() -> None:
    deny_secret = AclChecker([AclRule(False, Access.PUBLISH, "secret/#")], default_allow=True)
    assert not deny_secret.can_publish("secret/x")
    assert not deny_secret.can_publish("$delayed/1/secret/x")
    assert deny_secret.can_publish("$delayed/1/public/x")
    only_a = AclChecker([AclRule(True, Access.PUBLISH, "a/#")], default_allow=False)
    assert only_a.can_publish("$delayed/5/a/b")
    assert not only_a.can_publish("$delayed/5/b")


def test_the_publish_cache_stays_small_whatever_topics_a_client_uses() -> None:
    from services.common.acl import ACL_CACHE_CHARS, ACL_CACHE_ENTRIES, AclChecker

    acl = AclChecker([], default_allow=True)
    for i in range(3 * ACL_CACHE_ENTRIES):
        assert acl.can_publish(f"t/{i}/" + "x" * 4000)  # long topics
        cached = acl._cache  # what the connection holds
        assert len(cached) <= ACL_CACHE_ENTRIES
        assert sum(map(len, cached)) <= ACL_CACHE_CHARS + 512
