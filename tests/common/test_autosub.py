"""Auto-subscription templates: placeholders render escaped (a client id cannot widen the
filter), a missing user name skips a `%u` filter, bad templates are refused by name."""

from __future__ import annotations

import pytest

from services.common.topics import TopicLimits
from services.common.topics.autosub import AutoSubscription, check_template, render, render_all


def test_placeholders_render_escaped() -> None:
    assert render("cmd/%c/#", "dev-1", "") == "cmd/dev-1/#"
    assert render("cmd/%c/#", "#", "") == "cmd/%23/#"
    assert render("cmd/%c", "a/+/b", "") == "cmd/a%2F%2B%2Fb"
    assert render("u/%u/%c", "$x", "ann%") == "u/ann%25/%24x"
    assert render("100%%/%c", "c", "") == "100%/c"


def test_a_user_filter_is_skipped_without_a_user_name() -> None:
    assert render("u/%u", "c", "") is None
    subs = (AutoSubscription("u/%u", 1), AutoSubscription("c/%c", 2))
    assert render_all(subs, "c1", "", TopicLimits()) == [("c/c1", 2)]


def test_a_filter_too_long_for_the_node_is_skipped() -> None:
    subs = (AutoSubscription("c/%c", 0),)
    assert render_all(subs, "x" * 50, "", TopicLimits(max_length_bytes=20)) == []


@pytest.mark.parametrize(
    ("template", "qos", "says"),
    [
        ("a/%x", 0, "unknown placeholder"),
        ("a/%", 0, "lone %"),
        ("a/#/b", 0, "filter:"),
        ("$share/g/a", 0, "shared"),
        ("$SYS/a", 0, "$ topic"),
        ("a", 3, "qos"),
    ],
)
def test_bad_templates_are_refused(template: str, qos: int, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("$", r"\$")):
        check_template(template, qos)
