"""The republish action and the templates every action uses: the rendered topic, QoS and
retain reach the republisher; a column value can neither add levels nor wildcards nor a `$`
prefix; a template naming nothing dead-letters instead of publishing somewhere wrong."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.rules.actions import ActionContext, build_action
from services.rules.actions.dead_letters import SqliteDeadLetters
from services.rules.actions.delivery import Delivery, RetryPolicy
from tests.rules.actions.helpers import RecordingRepublisher, output


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteDeadLetters]:
    s = SqliteDeadLetters(tmp_path / "dl.db")
    yield s
    await s.close()


async def republish(
    params: dict[str, str], outs: list, store: SqliteDeadLetters, tmp_path: Path
) -> RecordingRepublisher:
    rep = RecordingRepublisher()
    action = build_action("republish", params, ActionContext(rep, None, tmp_path, "t1", "r1"))
    d = Delivery(action, "t1", "r1", store, RetryPolicy(max_attempts=1), action_name="rp")
    await d.start()
    try:
        await d.deliver(outs)
    finally:
        await d.close()
    return rep


async def test_rendered_topic_qos_retain_and_properties(
    store: SqliteDeadLetters, tmp_path: Path
) -> None:
    rep = await republish(
        {"topic": "alerts/${clientid}/${t}", "qos": "2", "retain": "true"},
        [output(1)],
        store,
        tmp_path,
    )
    [p] = rep.published
    assert (p.tenant, p.topic, p.qos, p.retain) == ("t1", "alerts/dev-1/31", 2, True)
    assert p.payload == b'{"t": 31, "i": 1}' and p.user_properties == (("k", "v"),)


async def test_qos_defaults_to_the_source_message(store: SqliteDeadLetters, tmp_path: Path):
    rep = await republish({"topic": "copy/${topic}"}, [output(1, qos=0)], store, tmp_path)
    [p] = rep.published
    assert (p.topic, p.qos, p.retain) == ("copy/sensors/a/temp", 0, False)


async def test_a_column_cannot_inject_levels_or_wildcards(
    store: SqliteDeadLetters, tmp_path: Path
) -> None:
    outs = [output(1, {"room": "+/#"}), output(2, {"room": "$SYS"}), output(3, {"room": "50%"})]
    rep = await republish({"topic": "rooms/${room}"}, outs, store, tmp_path)
    assert [p.topic for p in rep.published] == [
        "rooms/%2B%2F%23",
        "rooms/%24SYS",
        "rooms/50%25",
    ]


async def test_nested_columns_and_builtins(store: SqliteDeadLetters, tmp_path: Path) -> None:
    out = output(1, {"dev": {"site": "north", "n": 7}, "ok": True, "none": None})
    params = {"topic": "${dev.site}/${dev.n}/${ok}/${none}/${tenant}/${rule_id}/${qos}"}
    rep = await republish(params, [out], store, tmp_path)
    assert rep.published[0].topic == "north/7/true/null/t1/r1/1"


async def test_unknown_variable_dead_letters(store: SqliteDeadLetters, tmp_path: Path) -> None:
    rep = await republish({"topic": "x/${nope}"}, [output(1)], store, tmp_path)
    assert rep.published == []
    [letter] = await store.list("t1", "r1")
    assert "${nope}" in letter.error and letter.attempts == 1


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({}, "topic"),
        ({"topic": "a/+"}, "topic"),
        ({"topic": "$SYS/x"}, "topic"),
        ({"topic": "a/${b c}"}, "topic"),
        ({"topic": "a", "qos": "5"}, "qos"),
        ({"topic": "a", "retain": "maybe"}, "retain"),
    ],
)
def test_bad_params_name_the_param(params: dict[str, str], named: str, tmp_path: Path) -> None:
    ctx = ActionContext(RecordingRepublisher(), None, tmp_path, "t1", "r1")
    with pytest.raises(ValueError, match=rf"^{named}:"):
        build_action("republish", params, ctx)


async def test_never_into_a_dollar_topic(store: SqliteDeadLetters, tmp_path: Path) -> None:
    event = output(1, topic="$events/client_connected")
    rep = await republish({"topic": "${topic}"}, [event], store, tmp_path)
    assert rep.published == []
    [letter] = await store.list("t1", "r1")
    assert "$ topic" in letter.error
