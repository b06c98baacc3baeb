"""The retained index against a naive scan, and its cost bound."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.topics import topic_matches
from services.router.retained import Retained, RetainedIndex

levels = st.sampled_from(["a", "b", "$s", ""])
topics = st.lists(levels, min_size=1, max_size=4).map("/".join).filter(bool)


@st.composite
def filters(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.sampled_from(["a", "b", "$s", "", "+"]), min_size=1, max_size=3))
    if draw(st.booleans()):
        parts.append("#")
    return "/".join(parts) or "+"


@settings(max_examples=300, deadline=None)
@given(stored=st.lists(topics, max_size=20), f=filters())
def test_index_agrees_with_naive_scan(stored: list[str], f: str) -> None:
    idx = RetainedIndex()
    for t in stored:
        idx.put("t", t, Retained(t.encode(), 0))
    got, _ = idx.match("t", f, 0)
    assert sorted(topic for topic, _ in got) == sorted(
        t for t in set(stored) if topic_matches(f, t)
    )


def test_cost_is_what_matches_not_what_is_stored() -> None:
    idx = RetainedIndex()
    for i in range(10_000):
        idx.put("t", f"plant/{i}/temp", Retained(b"x", 0))
    for i in range(10):
        idx.put("t", f"lab/{i}/temp", Retained(b"y", 0))
    got, examined = idx.match("t", "lab/+/temp", 0)
    assert len(got) == 10
    assert examined < 50  # not 10,000
    assert idx.count("t") == 10_010


def test_expiry_and_delete() -> None:
    idx = RetainedIndex()
    idx.put("t", "a/b", Retained(b"1", 1000))
    assert [t for t, _ in idx.match("t", "a/#", 999)[0]] == ["a/b"]
    assert idx.match("t", "a/#", 1000)[0] == []
    assert idx.delete("t", "a/b") and not idx.delete("t", "a/b")
    assert idx.count("t") == 0 and idx.match("t", "#", 0)[0] == []
