"""Choosing the member of a shared subscription on this node."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

from services.connection.shared import pick_member


def _member(receive_maximum: int, inflight: int, pending: int = 0) -> Any:
    ob = SimpleNamespace(
        receive_maximum=receive_maximum,
        inflight=dict.fromkeys(range(inflight)),
        pending=deque(range(pending)) if pending else None,
    )
    return SimpleNamespace(channel=SimpleNamespace(outbound=ob))


def test_members_with_credit_take_turns() -> None:
    members = [_member(10, 0), _member(10, 0), _member(10, 0)]
    assert [pick_member(members, turn) for turn in range(1, 7)] == [1, 2, 0, 1, 2, 0]


def test_a_full_member_is_skipped_while_another_has_credit() -> None:
    members = [_member(2, 2), _member(2, 0)]
    assert pick_member(members, 0) == 1
    assert pick_member(members, 1) == 1


def test_when_none_has_credit_the_least_loaded_gets_it() -> None:
    members = [_member(2, 2, pending=5), _member(2, 2, pending=1), _member(2, 2, pending=3)]
    assert pick_member(members, 0) == 1
