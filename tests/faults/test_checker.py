"""The checker itself: it must see a loss, a QoS 2 duplicate and a reordering, and let QoS 1
repeats and clean-session losses through only where they are allowed."""

from __future__ import annotations

import pytest

from tests.faults.checker import Checker, parse, payload


def _checker() -> Checker:
    c = Checker()
    c.publisher("p1", 1)
    c.publisher("p2", 2)
    c.subscriber("s", persistent=True)
    c.subscriber("clean", persistent=False)
    for seq in range(3):
        for p in ("p1", "p2"):
            c.sent(p, seq)
            c.acked(p, seq)
    return c


def _deliver_all(c: Checker, sub: str, skip: tuple[str, int] | None = None) -> None:
    for seq in range(3):
        for p, qos in (("p1", 1), ("p2", 2)):
            if (p, seq) != skip:
                c.delivered(sub, payload(p, seq), qos)


def test_payload_round_trip() -> None:
    data = payload("pub-a", 42, 100)
    assert len(data) == 100 and parse(data) == ("pub-a", 42)


def test_all_delivered_once_in_order_passes() -> None:
    c = _checker()
    _deliver_all(c, "s")
    _deliver_all(c, "clean")
    v = c.verdict()
    v.check()
    assert (v.sent, v.acked, v.delivered, v.lost, v.qos2_duplicates) == (6, 6, 12, 0, 0)


def test_an_acknowledged_message_missing_is_lost() -> None:
    c = _checker()
    _deliver_all(c, "s", skip=("p1", 1))
    _deliver_all(c, "clean")
    v = c.verdict()
    assert v.lost == 1 and v.subscribers["s"].lost == [("p1", 1)]
    with pytest.raises(AssertionError, match="lost 1 acknowledged"):
        v.check()


def test_an_unacknowledged_message_missing_is_not_lost() -> None:
    c = _checker()
    c.sent("p1", 3)  # sent, never acknowledged, never delivered
    _deliver_all(c, "s")
    _deliver_all(c, "clean")
    c.verdict().check()


def test_qos2_repeat_fails_and_qos1_repeat_is_counted() -> None:
    c = _checker()
    _deliver_all(c, "s")
    _deliver_all(c, "clean")
    c.delivered("s", payload("p1", 0), 1)
    v = c.verdict()
    v.check()
    assert v.qos1_duplicates == 1
    c.delivered("s", payload("p2", 0), 2)
    with pytest.raises(AssertionError, match="QoS 2 twice"):
        c.verdict().check()


def test_a_qos2_publish_delivered_at_qos1_may_repeat() -> None:
    c = _checker()
    _deliver_all(c, "clean")
    for seq in range(3):
        c.delivered("s", payload("p1", seq), 1)
        c.delivered("s", payload("p2", seq), 1)  # the subscription asked for QoS 1
    c.delivered("s", payload("p2", 1), 1)
    v = c.verdict()
    v.check()
    assert v.qos1_duplicates == 1 and v.qos2_duplicates == 0


def test_out_of_order_first_arrivals_fail_for_a_persistent_session_only() -> None:
    c = _checker()
    for seq in (0, 2, 1):
        c.delivered("s", payload("p1", seq), 1)
        c.delivered("clean", payload("p1", seq), 1)
    for seq in range(3):
        c.delivered("s", payload("p2", seq), 2)
        c.delivered("clean", payload("p2", seq), 2)
    v = c.verdict()
    assert v.subscribers["s"].order_violations == [("p1", 1, 2)]
    assert v.order_violations == 1  # the clean session's are not counted
    with pytest.raises(AssertionError, match="out of order"):
        v.check()


def test_a_repeat_after_later_messages_is_not_a_reordering() -> None:
    c = _checker()
    _deliver_all(c, "s")
    _deliver_all(c, "clean")
    c.delivered("s", payload("p1", 0), 1)  # a QoS 1 resend after 1 and 2
    c.verdict().check()


def test_clean_session_loss_fails_unless_allowed() -> None:
    c = _checker()
    _deliver_all(c, "s")
    _deliver_all(c, "clean", skip=("p2", 2))
    v = c.verdict()
    assert v.clean_lost == 1 and v.lost == 0
    v.check(clean_may_lose=True)
    with pytest.raises(AssertionError, match="clean lost 1"):
        v.check()
