"""A durable shared group's queue past its depth limit: the publish is refused (MQTT 5 0x97,
the publisher learns the group did not take it), never an entry it acknowledged dropped,
whatever the queue's `depth_policy` (drop_oldest here, the default)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.cli.launcher import Launcher
from tests.poll import holds_within, wait_until
from tests.shared_groups.conftest import (
    group_launcher,
    group_state,
    members,
    node_port,
    publish_all,
)

pytestmark = pytest.mark.timeout(120)
DEPTH = 50


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    folder: Path = tmp_path_factory.mktemp("group-limits")
    env = {"STARLING_MAX_QUEUE_DEPTH": str(DEPTH), "STARLING_DEPTH_POLICY": "drop_oldest"}
    with group_launcher(folder, env=env) as launcher:
        yield launcher


def test_past_the_depth_limit_the_publish_is_refused(launcher: Launcher) -> None:
    tag = uuid.uuid4().hex[:8]
    group, topic = f"lim{tag}", f"lim/{tag}"
    ms = members(launcher, 2, f"$share/{group}/{topic}")
    for m in ms:
        m.close()
    sent = [str(i) for i in range(DEPTH + 10)]
    acked = publish_all(node_port(launcher, 0), topic, sent)
    assert acked == set(sent[:DEPTH])  # the rest refused (0x97), in order
    assert group_state(launcher, group, topic) == (DEPTH, DEPTH)
    for m in ms:
        m.connect()

    def arrived() -> list[str]:
        return [p for m in ms for p in m.payloads()]

    wait_until(lambda: len(arrived()) >= DEPTH, 15, lambda: f"{len(arrived())}")
    assert not holds_within(lambda: len(arrived()) > DEPTH, 0.5)
    assert sorted(arrived(), key=int) == sent[:DEPTH]  # every acknowledged one, once
    for m in ms:
        m.close()
