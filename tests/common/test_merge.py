"""One delivery per client for overlapping subscriptions [MQTT-3.3.4-2], [MQTT-3.3.4-3]."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.topics.merge import merge_matches


@dataclass(frozen=True)
class Sub:
    qos: int
    no_local: bool = False
    retain_as_published: bool = False
    sub_ids: tuple[int, ...] = ()


def _merge(
    matches: list[tuple[str, Sub]], qos: int = 2, retain: bool = False, publisher: str = "p"
):  # type: ignore[no-untyped-def]
    return merge_matches(matches, qos, retain, publisher, lambda k: k)


def test_highest_granted_qos_capped_by_the_publish_and_all_identifiers() -> None:
    merged = _merge(
        [("a", Sub(0, sub_ids=(1,))), ("a", Sub(2, sub_ids=(2,))), ("b", Sub(1))], qos=1
    )
    assert merged == {"a": (1, False, (1, 2)), "b": (1, False, ())}


def test_no_local_skips_only_the_publisher_and_retain_as_published_wins() -> None:
    matches = [("p", Sub(1, no_local=True)), ("q", Sub(1)), ("q", Sub(0, retain_as_published=True))]
    assert _merge(matches, retain=True) == {"q": (1, True, ())}
