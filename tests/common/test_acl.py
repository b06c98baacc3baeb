"""ACL evaluation: substitution, first match wins, subscribe coverage and overlap."""

from __future__ import annotations

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
